"""Where sandboxes run: the provider-neutral seam (``base.py``) and the providers behind it.

``docker/`` is the only package that imports ``docker``.
"""
