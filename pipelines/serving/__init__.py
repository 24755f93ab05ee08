"""Serve mode: the front before the engines, its store of served calls and rewards, and its commits."""
