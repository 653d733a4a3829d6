#!/usr/bin/env python3
"""Writes the JSON-schema corpus of `kiln bench grammar` (bench/grammar/schemas.jsonl), deterministically.

Varied like JSONSchemaBench's: nested objects, arrays (bounded, tuples), enums, const, anyOf/oneOf, allOf,
$ref/$defs recursion, patterns, formats, numeric bounds, string lengths, type lists, closed and open
objects. Usage: python3 bench/grammar/make_schemas.py [N] > bench/grammar/schemas.jsonl
"""
import json
import random
import sys

WORDS = ["name", "id", "email", "created_at", "price", "tags", "items", "address", "city", "zip", "status",
         "count", "user", "title", "description", "enabled", "score", "url", "phone", "country", "notes",
         "quantity", "category", "owner", "version", "parent", "children", "start", "end", "level"]
FORMATS = ["date-time", "date", "time", "uuid", "email", "ipv4", "hostname", "uri"]
PATTERNS = ["^[A-Z]{3}-[0-9]{4}$", "^[a-z][a-z0-9_]*$", "^\\+?[0-9]{7,12}$", "^[0-9]{5}(-[0-9]{4})?$",
            "^(red|green|blue)$", "^#[0-9a-fA-F]{6}$", "v[0-9]+\\.[0-9]+"]


def scalar(r, depth):
    k = r.randrange(12)
    if k == 0:
        return {"type": "string"}
    if k == 1:
        return {"type": "string", "maxLength": r.choice([8, 16, 32]), "minLength": r.choice([0, 1, 2])}
    if k == 2:
        return {"type": "string", "format": r.choice(FORMATS)}
    if k == 3:
        return {"type": "string", "pattern": r.choice(PATTERNS)}
    if k == 4:
        return {"type": "integer", "minimum": r.choice([0, 1, -100]), "maximum": r.choice([10, 999, 65535])}
    if k == 5:
        return {"type": "number", "minimum": 0}
    if k == 6:
        return {"type": "number"}
    if k == 7:
        return {"type": "boolean"}
    if k == 8:
        return {"enum": r.sample(["low", "medium", "high", "urgent", "none", "x"], r.randint(2, 5))}
    if k == 9:
        return {"type": ["string", "null"]}
    if k == 10:
        return {"const": r.choice(["v1", 1, True])}
    return {"type": "integer"}


def schema(r, depth):
    k = r.randrange(10) if depth < 3 else 0
    if k <= 3:
        return scalar(r, depth)
    if k <= 6:
        props = {w: schema(r, depth + 1) for w in r.sample(WORDS, r.randint(1, 6))}
        s = {"type": "object", "properties": props,
             "required": r.sample(list(props), r.randint(0, len(props)))}
        if r.random() < 0.6:
            s["additionalProperties"] = False
        return s
    if k == 7:
        s = {"type": "array", "items": schema(r, depth + 1)}
        if r.random() < 0.5:
            s["minItems"] = r.randint(0, 2)
        if r.random() < 0.5:
            s["maxItems"] = r.randint(2, 6)
        return s
    if k == 8:
        return {"anyOf": [schema(r, depth + 1) for _ in range(r.randint(2, 3))]}
    return {"type": "array", "prefixItems": [scalar(r, depth + 1) for _ in range(r.randint(1, 3))], "items": False}


def recursive(r):
    node = {"type": "object", "properties": {"value": scalar(r, 2), "children": {
        "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["value"],
        "additionalProperties": False}
    return {"$defs": {"node": node}, "$ref": "#/$defs/node"}


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    r = random.Random(20261206)
    for i in range(n):
        if i % 10 == 9:
            s = recursive(r)
        elif i % 10 == 8:
            base = schema(r, 1)
            s = {"allOf": [{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                           {"type": "object", "properties": {"name": {"type": "string"}, "extra": base}}]}
        else:
            props = {w: schema(r, 1) for w in r.sample(WORDS, r.randint(2, 8))}
            s = {"type": "object", "properties": props, "required": r.sample(list(props), r.randint(1, len(props)))}
            if r.random() < 0.5:
                s["additionalProperties"] = False
        print(json.dumps(s))


if __name__ == "__main__":
    main()
