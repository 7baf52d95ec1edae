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
# pydata-sphinx-theme: the base of PyTorch's own docs theme (the layout our users know), NumPy's
# and pandas'; a wide main column for the benchmark tables, the page's outline beside it, dark mode
html_theme = "pydata_sphinx_theme"
html_title = "fused_amp"
html_theme_options = {"show_toc_level": 2, "navigation_with_keys": False, "secondary_sidebar_items": ["page-toc"]}
# the pages are listed in the header's navigation bar; without the left sidebar the main column
# holds a table of 10 columns or a line of code of 88 characters at a 1280-pixel window
html_sidebars = {"**": []}
html_static_path = ["_static"]
html_css_files = ["tables.css"]
