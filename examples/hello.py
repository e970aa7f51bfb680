# /// script
# requires-python = ">=3.9"
# dependencies = ["six==1.16.0"]
# ///
"""A first snakebox run: a PEP 723 script with one dependency, installed and cached by uv."""
import platform

import six

print(f"Hello from Python {platform.python_version()} in a sandbox, with six {six.__version__}")
