"""Thin Ray shells over the ``system`` core, the controller and the ``aisrl`` command line."""
