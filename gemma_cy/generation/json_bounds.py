"""The default bounds of a JSON Schema reply (docs/structured_output.md#bounds).

A JSON Schema alone lets a reply run forever: a number's digits, a
string's characters, an open object's keys, the whitespace between
tokens; a small model given that freedom often takes it (``0.5000...``
until ``max_tokens``). ``bounded_schema`` returns the schema with a bound
wherever it sets none, written in JSON Schema's own keywords, so
llguidance compiles it as any schema and the schema's own bounds stay
as they are:

- a number: its integral part below ``10**integer_digits``
  (``exclusiveMinimum``/``exclusiveMaximum``), at most ``fraction_digits``
  digits after the point (``multipleOf``); an integer: at most
  ``integer_digits`` digits (``minimum``/``maximum``);
- a string: at most ``string_length`` characters (``maxLength``);
- an object that lists properties and says nothing of others: no others
  (``additionalProperties: false``, as llama.cpp's converter reads it);
- a free value (one the schema leaves open: json_object's members, ``{}``,
  an object's ``additionalProperties: true``, an array's unlisted items):
  those scalars, containers at most ``free_depth`` deep of at most
  ``free_members`` members, keys of at most ``string_length`` characters;
- whitespace, where the schema's "x-guidance" asks for it flexible and
  gives no pattern: ``WHITESPACE``.

A schema's own "x-bounds" object changes these (null: no bound). A part
of an intersection (allOf...) is left as it is, what it holds bounded.
"""
from __future__ import annotations

import math
from decimal import Decimal

from ..errors import ParameterError

# Digits of an integral part: every 15-digit integer is exact in a float64,
# which is how llguidance reads a schema's bounds (10**16 - 1 is not).
INTEGER_DIGITS = 15
# Digits after the point: multipleOf 1e-10 is the finest llguidance reads
# exactly (it scales the float64 by 10 until it is whole; 1e-11 never is).
FRACTION_DIGITS = 10
JSON_BOUNDS = {"integer_digits": INTEGER_DIGITS, "fraction_digits": FRACTION_DIGITS, "string_length": 2000,
               "free_members": 16, "free_depth": 3}
# Each bound's range; 18: llguidance's integer ranges are int64. A free value
# is written out level by level, 2**free_depth copies of the innermost.
LIMITS = {"integer_digits": (1, 18), "fraction_digits": (0, FRACTION_DIGITS), "string_length": (0, 10**6),
          "free_members": (0, 10**6), "free_depth": (0, 8)}
# llama.cpp's whitespace (a space, or one or two newlines and an indent of
# up to 20), once between tokens: what flexible whitespace means here.
WHITESPACE = r"(\x20|\n{1,2}[\x20\t]{0,20})"
# Keywords that describe a value without constraining it: a schema of only
# these (or none) is a free value.
ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
               "$schema", "$id", "$anchor", "$defs", "definitions", "x-guidance"}
# Keywords that intersect a schema with others, and an object's own.
COMPOSING = {"allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "then", "else", "dependentSchemas", "not"}
OBJECT_KEYWORDS = {"properties", "patternProperties", "additionalProperties", "required"}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")  # items: a list before draft 2020-12
_SCHEMA_ONE = ("items", "additionalItems", "additionalProperties")


def read_bounds(options, where: str) -> dict:
    """JSON_BOUNDS with a schema's "x-bounds" object applied, checked."""
    if options is None:
        return dict(JSON_BOUNDS)
    if not isinstance(options, dict):
        raise ParameterError(f"{where}: x-bounds is an object of {', '.join(JSON_BOUNDS)}, got {options!r:.60}")
    bounds = dict(JSON_BOUNDS)
    for key, value in options.items():
        if key not in JSON_BOUNDS:
            raise ParameterError(f"{where}: x-bounds: unknown key {key!r:.40} (known: {', '.join(JSON_BOUNDS)})")
        low, high = LIMITS[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise ParameterError(f"{where}: x-bounds.{key} = {value!r:.40}, must be null or an integer "
                                 f"from {low} to {high}")
        bounds[key] = value
    return bounds


def bounded_schema(schema: dict, where: str) -> dict:
    """``schema`` with the default bounds where it has none (a new dict,
    its "x-bounds" read and removed). ParameterError for a bad "x-bounds"."""
    schema = dict(schema)
    out = _Bounds(read_bounds(schema.pop("x-bounds", None), where), _extended(schema)).schema(schema)
    layout = out.get("x-guidance")
    if isinstance(layout, dict) and layout.get("whitespace_flexible") and "whitespace_pattern" not in layout:
        out["x-guidance"] = {**layout, "whitespace_pattern": WHITESPACE}
    return out


def _extended(node, found: set | None = None) -> set[str]:
    """The "$ref"s that a schema uses beside keywords of its own (each
    intersected with them, as an allOf part is)."""
    found = set() if found is None else found
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str) and set(node) - ANNOTATIONS - {"$ref"}:
            found.add(node["$ref"])
        for value in node.values():
            _extended(value, found)
    elif isinstance(node, list):
        for value in node:
            _extended(value, found)
    return found


def _types(node: dict) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _number(x) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _decimals(x: float) -> int:
    """Digits after the point that ``x`` (a schema's bound) is written with."""
    return max(0, -Decimal(repr(x)).normalize().as_tuple().exponent) if isinstance(x, float) else 0


def is_free(node) -> bool:
    """True for a schema that leaves the value open: true, or annotations only."""
    return node is True or (isinstance(node, dict) and set(node) <= ANNOTATIONS)


class _Bounds:
    """One schema's bounds: ``schema`` walks it, bounding every value it allows."""

    def __init__(self, bounds: dict, extended: set[str]) -> None:
        self.bounds = bounds
        self.extended = extended  # the $defs a "$ref" extends: parts of an intersection
        self._free: dict[int, dict] = {}  # free_value by depth, shared within the schema

    def schema(self, node, depth: int | None = None, part: bool = False):
        """``node`` (a schema, or a bool) bounded; a free one becomes the
        free value of ``depth`` levels (default ``free_depth``). A ``part``
        (intersected with other schemas: an allOf's part, a schema beside a
        "$ref"...) takes no bound of its own, which could narrow a bound or a
        key another part gives; what it holds (properties, items) does."""
        depth = self.bounds["free_depth"] if depth is None else depth
        if is_free(node):
            return self.free_value(depth, node)
        if not isinstance(node, dict):
            return node
        out = dict(node)
        part = part or bool(COMPOSING & set(out))
        for key in _SCHEMA_MAPS:
            if isinstance(out.get(key), dict):
                out[key] = {k: self.schema(v, part=f"#/{key}/{k}" in self.extended) for k, v in out[key].items()}
        beside = bool(OBJECT_KEYWORDS & set(out))  # an anyOf's parts are intersected with these
        for key in _SCHEMA_LISTS:
            if isinstance(out.get(key), list):
                out[key] = [self.schema(v, part=key == "allOf" or (beside and key in ("anyOf", "oneOf")))
                            for v in out[key]]
        for key in _SCHEMA_ONE:
            if isinstance(out.get(key), dict) and not is_free(out[key]):
                out[key] = self.schema(out[key])
        if part or "enum" in out or "const" in out:
            return out
        types = _types(out)
        if types & {"number", "integer"}:
            self.number(out, integer="number" not in types)
        if "string" in types:
            self.string(out)
        below = max(depth - 1, 0) if depth is not None else 0  # (free_depth null: free values stay as given)
        if "array" in types:
            self.array(out, below)
        if "object" in types:
            self.object(out, below)
        return out

    def free_value(self, depth: int, node=True):
        """Any JSON value, its scalars bounded, containers at most ``depth``
        levels deep (``node``'s annotations kept; with free_depth null, the
        value is left as the schema gives it)."""
        if self.bounds["free_depth"] is None:
            return node
        if depth not in self._free:
            value = {"type": ["null", "boolean", "number", "string"]}
            self.number(value, integer=False)
            self.string(value)
            if depth > 0:
                value["type"] += ["array", "object"]
                self.array(value, depth - 1)
                self.object(value, depth - 1)
            self._free[depth] = value
        return {**node, **self._free[depth]} if isinstance(node, dict) else self._free[depth]

    def number(self, node: dict, integer: bool) -> None:
        """Bound the integral part on each side the schema leaves open (if
        its other side is inside the bound), and the fraction where it gives
        no multipleOf and its bounds need no finer one."""
        digits, fraction = self.bounds["integer_digits"], self.bounds["fraction_digits"]
        low = _number(node.get("minimum", node.get("exclusiveMinimum")))
        high = _number(node.get("maximum", node.get("exclusiveMaximum")))
        if digits is not None:
            edge = 10 ** digits
            if low is None and (high is None or high > -edge):
                node.update({"minimum": 1 - edge} if integer else {"exclusiveMinimum": -edge})
            if high is None and (low is None or low < edge):
                node.update({"maximum": edge - 1} if integer else {"exclusiveMaximum": edge})
        if (fraction is not None and not integer and "multipleOf" not in node
                and all(_decimals(x) <= fraction for x in (low, high) if x is not None)):
            node["multipleOf"] = 10.0 ** -fraction if fraction else 1

    def string(self, node: dict) -> None:
        length = self.bounds["string_length"]
        if length is not None and "maxLength" not in node:
            least = node.get("minLength")
            node["maxLength"] = max(length, least) if isinstance(least, int) else length

    def array(self, node: dict, below: int) -> None:
        """Items the schema leaves free: free values of ``below`` levels, at
        most ``free_members`` more than it lists."""
        if "items" in node and not is_free(node["items"]):
            return
        node["items"] = self.free_value(below, node.get("items", True))
        listed = node.get("prefixItems", [])
        if self.bounds["free_members"] is not None and "maxItems" not in node and isinstance(listed, list):
            node["maxItems"] = len(listed) + self.bounds["free_members"]

    def object(self, node: dict, below: int) -> None:
        """An object that lists properties and says nothing of others takes
        no others (llama.cpp's reading); where it leaves them free
        (``additionalProperties`` true, or nothing listed): any key of at
        most ``string_length`` characters with a free value of ``below``
        levels, at most ``free_members`` of them where nothing is listed
        (llguidance counts no keys beside optional properties)."""
        if "patternProperties" in node or "unevaluatedProperties" in node:
            return
        if "additionalProperties" not in node and "properties" in node:
            node["additionalProperties"] = False
            return
        extra = node.get("additionalProperties", True)
        if not is_free(extra):
            return
        value = self.free_value(below, extra)
        length = self.bounds["string_length"]
        if length is None:
            node["additionalProperties"] = value
        else:  # a key's length is only a pattern's to state
            node["patternProperties"] = {f"^.{{0,{length}}}$": value}
            node["additionalProperties"] = False
        if "properties" not in node and self.bounds["free_members"] is not None and "maxProperties" not in node:
            node["maxProperties"] = self.bounds["free_members"]
