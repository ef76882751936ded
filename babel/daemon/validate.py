"""Checks of request fields: sync options (by the same rules as ``babel sync``), URIs, numbers.

Each raises :class:`~babel.daemon.errors.RequestRejected` naming the field (HTTP 400).
"""

from __future__ import annotations

from typing import Any

from babel.backends import open_store
from babel.daemon.errors import RequestRejected
from babel.errors import BadURI
from babel.options import BadOption, SyncOptions, options_from_dict


def options_from_json(doc: Any) -> SyncOptions:
    """:class:`SyncOptions` from a request's ``options`` object (missing fields take their defaults).

    The rules are :data:`babel.options.RULES`, the ones the ``babel sync`` flags obey.

    Raises:
        RequestRejected: not an object, an unknown option name, or a value of the wrong
            type or out of bounds; ``field`` is ``options`` or ``options.NAME``.
    """
    try:
        return options_from_dict(doc)
    except BadOption as exc:
        where = f"options.{exc.field}" if exc.field else "options"
        raise RequestRejected(f"options.{exc}" if exc.field else str(exc), field=where) from exc


def check_uri(uri: Any, name: str) -> str:
    """``uri`` if it is a URI string with a known scheme.

    Raises:
        RequestRejected: it is not (``field`` is ``name``).
    """
    if not isinstance(uri, str) or not uri:
        raise RequestRejected(f"{name} must be a URI string", field=name)
    try:
        open_store(uri)
    except BadURI as exc:
        raise RequestRejected(f"{name}: BadURI: {exc}", field=name) from exc
    return uri


def check_positive(value: Any, name: str, unit: str = "") -> float:
    """``value`` if it is a number > 0 (``unit`` goes into the message).

    Raises:
        RequestRejected: it is not.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise RequestRejected(f"{name} must be a number > 0{f' ({unit})' if unit else ''}", field=name)
    return float(value)


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is true or false.

    Raises:
        RequestRejected: it is not.
    """
    if not isinstance(value, bool):
        raise RequestRejected(f"{name} must be true or false", field=name)
    return value
