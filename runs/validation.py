"""JSON-schema checks shared by the service layer and the engine (a leaf module)."""

from __future__ import annotations

from typing import Any

import jsonschema


def schema_errors(schema: dict[str, Any] | None, value: Any) -> list[dict[str, str]]:
    """Every way `value` breaks `schema`, as [{"field": "a.b", "message": ...}], sorted by field."""
    if not schema:
        return []
    validator = jsonschema.Draft202012Validator(schema)
    errors = []
    for err in validator.iter_errors(value):
        path = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "required":
            # jsonschema reports a missing property at the parent; name the property itself.
            missing = err.message.split("'")[1] if "'" in err.message else ""
            path = f"{path}.{missing}" if path and missing else (missing or path)
        errors.append({"field": path or "(root)", "message": err.message})
    return sorted(errors, key=lambda e: e["field"])
