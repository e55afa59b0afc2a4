"""Triton Python-backend models served unchanged: ``triton_python_backend_utils``
(``pb_utils.py``) and the ``TritonPythonModel`` adapter (``adapter.py``)."""
