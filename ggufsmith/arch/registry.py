"""The one registry of architecture plugins: ours, and third-party ones from the entry-point group
`ggufsmith.architectures` (each entry point names an Architecture subclass)."""

from __future__ import annotations

from functools import lru_cache
from importlib import import_module
from importlib.metadata import entry_points

from ggufsmith.arch.base import Architecture, HFConfig
from ggufsmith.errors import ConversionError

ENTRY_POINT_GROUP = "ggufsmith.architectures"

# Our own plugins, by module. Each module defines one or more Architecture subclasses.
BUILTIN_MODULES: tuple[str, ...] = (
    "llama", "qwen", "starcoder2", "olmo", "granite", "smollm3", "stablelm", "seed_oss", "ernie", "command_r",
    "gemma", "gemma4", "gemma_embedding",
    "qwen_moe", "deepseek", "glm_moe", "hunyuan", "dots1", "llama4", "gpt_oss",
    "phi3", "glm4", "minimax", "exaone4", "mistral3", "apertus",
    "falcon", "gpt2", "gptneox", "gptj", "bloom", "mpt",
    "mamba", "qwen_hybrid", "lfm2", "jamba", "nemotron_h", "falcon_h1", "rwkv", "whisper",
    "bert", "nomic_bert", "modern_bert", "jina_bert_v3", "eurobert", "t5",
)


@lru_cache(maxsize=1)
def all_architectures() -> dict[str, type[Architecture]]:
    """name -> plugin class. Ours first; an entry point may not silently replace one of ours."""
    plugins: dict[str, type[Architecture]] = {}
    for module_name in BUILTIN_MODULES:
        module = import_module(f"ggufsmith.arch.{module_name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Architecture) and obj.__module__ == module.__name__:
                _add(plugins, obj, f"ggufsmith.arch.{module_name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = ep.load()
        except Exception as e:  # a broken third-party package must not break conversion of others
            raise ConversionError(f"architecture plugin {ep.name!r} ({ep.value}) failed to load: {e}") from e
        if not (isinstance(plugin, type) and issubclass(plugin, Architecture)):
            raise ConversionError(f"entry point {ep.name!r} ({ep.value}) is not an Architecture subclass")
        _add(plugins, plugin, ep.value)
    return plugins


def _add(plugins: dict[str, type[Architecture]], plugin: type[Architecture], origin: str) -> None:
    name = getattr(plugin, "name", None)
    if not name:
        return  # an abstract helper class
    if name in plugins and plugins[name] is not plugin:
        raise ConversionError(f"two plugins claim architecture {name!r}: {plugins[name].__module__} and {origin}")
    plugins[name] = plugin


def get_architecture(name: str) -> type[Architecture]:
    plugins = all_architectures()
    if name not in plugins:
        raise ConversionError(f"unknown architecture {name!r}; supported: {', '.join(sorted(plugins))}")
    return plugins[name]


def find_architecture(config: HFConfig) -> type[Architecture]:
    """The plugin that claims this config.json (by `architectures`, else by `model_type`)."""
    for plugin in all_architectures().values():
        if plugin.claims(config):
            return plugin
    found = ", ".join(config.architectures) or config.model_type or "nothing"
    supported = ", ".join(sorted(all_architectures()))
    raise ConversionError(
        f"{config.path}: no plugin for {found}; pass --arch with one of: {supported}"
    )
