"""bookfs: Urbit event logs as a filesystem."""
__version__ = "0.1.0"
