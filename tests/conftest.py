"""Shared pytest setup: `gpu` tests skip cleanly on machines without an NVIDIA GPU."""

from __future__ import annotations

import pytest
from max.driver import accelerator_count


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every `gpu` test as skipped when no accelerator is present."""
    if accelerator_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
