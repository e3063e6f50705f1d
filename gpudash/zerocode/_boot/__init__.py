"""The folder ``gpudash run`` puts first on the child's PYTHONPATH (see sitecustomize.py)."""
