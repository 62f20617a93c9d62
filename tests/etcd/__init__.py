"""Tests of the etcd backend's pieces against etcd members of their own (tests/etcd_server.py)."""

from __future__ import annotations
