"""transformers.utils' import paths that lathe provides: `from lathe.utils import logging`."""
