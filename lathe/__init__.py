"""lathe: train and fine-tune PyTorch models. Public names are re-exported lazily from lathe.train."""

from lathe import _moved
from lathe._lazy import make_getattr
from lathe.train import EXPORTS

__version__ = "0.1.0"
__all__ = sorted(EXPORTS)
__getattr__ = make_getattr(__name__, EXPORTS)
_moved.install()  # old module paths (pickled checkpoints, scripts) import the moved modules


def __dir__():
    return __all__ + ["__version__"]
