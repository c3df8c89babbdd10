"""The old home of :func:`attnstudy.models.inference.predict_loaded`, kept for pyfuncs logged
before src/attnstudy was grouped into folders (7ca8cce and earlier): their stored ``serving.py``
imports ``attnstudy.inference``, and in a process that has already imported the installed
attnstudy (a notebook that used :mod:`attnstudy.api`, ``attnstudy predict``) that name resolves in
the installed package, not in the model's stored code. New code imports
:mod:`attnstudy.models.inference`; tests/models/test_pyfunc_before_folders.py holds both cases."""

from attnstudy.models.inference import predict_loaded

__all__ = ["predict_loaded"]
