"""The package's one version string (setup.cfg reads it)."""
__version__ = "0.1.0"
