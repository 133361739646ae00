"""``ray_kwargs.ray_init.*``: verl hands this section to ``ray.init`` whole, so a key the schema does not declare is
checked against ``ray.init``'s own signature at load (here, below the distributed layer: Ray is imported only when
such a key is met)."""
from __future__ import annotations

RAY_INIT_SECTION = "ray_kwargs.ray_init"
"""verl passes every key of this section to ``ray.init`` (``ray.init(**ray_kwargs.ray_init)`` in ``run_ppo``)."""


def ray_init_key_error(path: str) -> str | None:
    """None when ``path`` (``ray_kwargs.ray_init.<name>[.sub]``, a key the schema does not declare) names an
    argument of ``ray.init`` (``inspect.signature(ray.init)``, its ``**kwargs`` aside), which verl passes through;
    else the error line, with the closest argument names. ``path`` outside the section: None (not ours to judge)."""
    import difflib
    import inspect

    import ray

    if not path.startswith(RAY_INIT_SECTION + "."):
        return None
    name = path[len(RAY_INIT_SECTION) + 1:].split(".")[0]
    params = [p.name for p in inspect.signature(ray.init).parameters.values() if p.kind != p.VAR_KEYWORD]
    if name in params:
        return None
    near = difflib.get_close_matches(name, params, n=3)
    hint = f" Did you mean {', '.join(repr(n) for n in near)}?" if near else ""
    return (f"'{path}': {name!r} is not an argument of ray.init (Ray {ray.__version__}), which verl passes "
            f"{RAY_INIT_SECTION}.* to.{hint}")
