"""Small datasets built by (or shipped with) the package: nothing is downloaded."""

from tinyamp.data.spiral import spiral

__all__ = ["spiral"]
