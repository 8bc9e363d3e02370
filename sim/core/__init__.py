"""The core layer: what every stage shares, importing nothing else of the project.

errors (the one exception root), params (frozen-dataclass parameters with their bounds, the loop's among them),
io (strict readers, atomic writes), stops (signals), the protocols every stage is written against (governor,
drafter, target, forward costs) and one generic registry. A test holds this package free of project imports.
"""
