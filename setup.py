"""Package discovery that cannot drift: every package under ``agentcache/`` (and its data folders, as namespace
packages: setuptools installs package data only from folders listed as packages), plus the top-level ``adapters/``
and ``policies/`` folders installed as ``agentcache.adapters`` / ``agentcache.policies`` (``package-dir`` in
pyproject.toml). Everything else about the distribution is declared in pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

packages = find_namespace_packages(include=["agentcache", "agentcache.*"], exclude=["*__pycache__"])
for folder in ("adapters", "policies"):
    packages += [f"agentcache.{name}" for name in find_packages(include=[folder, f"{folder}.*"])]

setup(packages=packages)
