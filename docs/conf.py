"""Sphinx configuration of fused_amp's documentation (make docs)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the package, with its built extension (make build)

project = "fused_amp"
author = "the fused_amp developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_static_path = []
