"""Tool domains: each is a real environment with tools, tasks and a demonstrator."""

from __future__ import annotations

from importlib import import_module

from envace.domains.base import Backend, Checklist, Domain, Mistakes, Task, Tool  # noqa: F401

DOMAINS = ("bank", "files", "trading")


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(DOMAINS)}")
    return import_module(f"envace.domains.{name}").DOMAIN
