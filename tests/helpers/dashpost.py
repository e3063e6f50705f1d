"""Post a Dash callback the way the browser does: ``post(client, app, "cursor-slider.value", inputs, state)``."""

from __future__ import annotations

from typing import Any


def callback_key(app: Any, output: str) -> str:
    """The callback_map key whose outputs include ``output`` (``"cursor-slider.value"``)."""
    for key in app.callback_map:
        if output == key.split("@")[0] or f"..{output}..." in key or key.startswith(f"..{output}.."):
            return str(key)
    raise KeyError(output)


def payload(app: Any, output: str, inputs: dict[str, Any], state: dict[str, Any] | None = None,
            triggered: str | None = None) -> dict[str, Any]:
    key = callback_key(app, output)
    spec = app.callback_map[key]

    def props(items: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for i in items:
            name = f"{i['id']}.{i['property']}"
            out.append({"id": i["id"], "property": i["property"], "value": values.get(name)})
        return out

    ins = props(spec["inputs"], inputs)
    outs = [{"id": o.split(".")[0], "property": o.split(".")[1].split("@")[0]}
            for o in key.strip(".").split("...")]
    return {"output": key, "outputs": outs if key.startswith("..") else outs[0], "inputs": ins,
            "state": props(spec["state"], state or {}),
            "changedPropIds": [triggered or f"{ins[0]['id']}.{ins[0]['property']}"]}


def post(client: Any, app: Any, output: str, inputs: dict[str, Any], state: dict[str, Any] | None = None,
         triggered: str | None = None) -> Any:
    return client.post("/_dash-update-component", json=payload(app, output, inputs, state, triggered))
