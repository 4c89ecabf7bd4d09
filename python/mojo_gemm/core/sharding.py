"""What every sharded layer's `shard(devices)` checks first (MAX's sharding protocol)."""

from __future__ import annotations

from collections.abc import Iterable

from max.graph import DeviceRef, ShardingStrategy


def shard_devices(owner: str, strategy: ShardingStrategy | None,
                  devices: Iterable[DeviceRef]) -> list[DeviceRef]:
    """`devices` as a list, one per shard of `strategy`. owner: the class name for the error.

    Raises ValueError when no strategy is set or len(devices) differs from its num_devices.
    """
    if strategy is None:
        raise ValueError(f"{owner}.shard: sharding_strategy must be set first, got None")
    devices = list(devices)
    if len(devices) != strategy.num_devices:
        raise ValueError(
            f"{owner}.shard: devices must have {strategy.num_devices} entries (the "
            f"strategy's num_devices), got {len(devices)}"
        )
    return devices
