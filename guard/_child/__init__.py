"""Holds the `sitecustomize.py` that `python -m guard` puts on PYTHONPATH for child processes.

A package only so that installs ship the file; nothing imports it as `guard._child`.
"""
