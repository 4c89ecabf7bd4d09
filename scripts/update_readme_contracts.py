"""Rewrites the README's contract section from `mojo_gemm.contracts` (run after changing a rule).

    PYTHONPATH=python python scripts/update_readme_contracts.py
"""

from __future__ import annotations

import re
from pathlib import Path

from mojo_gemm import contracts

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- contracts:begin -->", "<!-- contracts:end -->"


def main() -> None:
    """Replaces the text between the markers with every contract's markdown."""
    body = "\n\n".join(c.markdown() for c in contracts.ALL_CONTRACTS)
    text = README.read_text()
    new = re.sub(
        re.escape(BEGIN) + ".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{body}\n{END}",
        text,
        flags=re.S,
    )
    README.write_text(new)


if __name__ == "__main__":
    main()
