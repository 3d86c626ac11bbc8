"""Findings -> text, JSON, JUnit and HTML (the last stage)."""
