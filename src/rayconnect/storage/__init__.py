"""Where tables live: local disk or object storage (S3, GCS, Azure), and an embedded S3."""

from rayconnect.storage.location import StorageError, TableLocation

__all__ = ["StorageError", "TableLocation"]
