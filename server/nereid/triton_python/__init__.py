"""Triton Python-backend models served unchanged: ``triton_python_backend_utils``
(``pb_utils.py``, over ``messages.py``, ``auto_complete_config.py`` and ``bls.py``) and the
``TritonPythonModel`` adapter (``adapter.py``)."""
