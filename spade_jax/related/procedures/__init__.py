"""Procedure memory with preplay (ProPlay), a related system: `memory.py`. Joined to a run as an
agent component by `selfplay/components/procedures.py`."""
