"""Thin, transport-free handlers: functions of a plain Request value to a plain Response value.

``importer.handlers.wsgi`` is the WSGI transport around them.
"""
