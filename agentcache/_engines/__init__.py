"""Local inference engines that agentcache can drive directly (for tests and local experiments).

Submodules are imported explicitly (``from agentcache._engines.llama import LlamaServer``) so that importing this
package never starts anything or needs an optional dependency.
"""
