#!/usr/bin/env python3
"""Validates constrained outputs with python3-jsonschema (an independent,
published validator): for every <n>.schema.json in the folder given, each
<n>.<run>.out.json must parse as JSON (Python's json module, which refuses
trailing data) and validate against the schema under the validator the
schema's draft calls for (Draft 2020-12 when it names none). Exit status 1
and one line per failure otherwise; 2 when nothing was checked."""
import glob
import json
import os
import sys

import jsonschema

folder = sys.argv[1]
failures = checked = 0
for schema_path in sorted(glob.glob(os.path.join(folder, "*.schema.json"))):
    stem = os.path.basename(schema_path)[: -len(".schema.json")]
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for out_path in sorted(glob.glob(os.path.join(folder, stem + ".*.out.json"))):
        checked += 1
        with open(out_path, encoding="utf-8") as f:
            text = f.read()
        try:
            doc = json.loads(text)
        except ValueError as e:
            print(f"{out_path}: not JSON ({e}): {text!r}")
            failures += 1
            continue
        errors = list(validator.iter_errors(doc))
        for err in errors:
            print(f"{out_path}: {err.message} at {list(err.absolute_path)}: {text!r}")
        failures += bool(errors)
print(f"validate.py: {checked} outputs checked, {failures} invalid")
sys.exit(1 if failures else 0 if checked else 2)
