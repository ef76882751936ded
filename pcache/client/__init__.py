"""PCache client SDK: async core (:class:`PCacheClient`) and one sync bridge (:class:`Client`)."""

from pcache.client.core import FileStat, PCacheClient
from pcache.client.file import PCacheFile
from pcache.client.sync import Client, File

__all__ = ["Client", "File", "FileStat", "PCacheClient", "PCacheFile"]
