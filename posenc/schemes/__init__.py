"""Every positional scheme, one module per family; importing this package registers them all.

Each module decorates its classes with `posenc.scheme.register`, so a new scheme is a new
module here and nothing else: the loop below imports every module it finds.
"""
import importlib
import pkgutil

MODULES = tuple(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
