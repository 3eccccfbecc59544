"""Byte counts in binary units, the one formatter every printed table and repr uses."""

from __future__ import annotations


def format_bytes(n: int, kib_decimals: int = 1) -> str:
    """`n` bytes as "512 B", "1.5 KiB" or "10.8 MiB" (1 KiB = 1024 B): `kib_decimals` digits for KiB, one for MiB."""
    if n < 1024:
        return f"{n} B"
    if n < 1024**2:
        return f"{n / 1024:.{kib_decimals}f} KiB"
    return f"{n / 1024**2:.1f} MiB"
