"""This repository's study pages (``studies/<paper>.md``) and README's results table.

Not part of the installed ``raymvc`` package, which never imports it: run it through
``python tools/study_pages.py`` from a checkout.
"""
