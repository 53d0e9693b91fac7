"""Verifiable rewards: ``completion text, reference -> float``, chosen by the config's ``type``."""
