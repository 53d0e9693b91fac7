"""Prompt sources: the synthetic arithmetic task and GSM8K-style files, behind one protocol."""
