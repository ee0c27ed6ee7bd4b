"""Drives a schema registry with confluent-kafka's SchemaRegistryClient,
the way producers and tools do, and prints what it saw as JSON. Exits
non-zero with the failed step when the registry answers wrongly."""

import json
import sys

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

V1 = json.dumps({"type": "record", "name": "Probe", "namespace": "walbridge.test",
                 "fields": [{"name": "id", "type": "long"}]})
V2 = json.dumps({"type": "record", "name": "Probe", "namespace": "walbridge.test",
                 "fields": [{"name": "id", "type": "long"},
                            {"name": "note", "type": ["null", "string"], "default": None}]})
BREAKS = json.dumps({"type": "record", "name": "Probe", "namespace": "walbridge.test",
                     "fields": [{"name": "id", "type": "long"}, {"name": "must", "type": "string"}]})


def main():
    client = SchemaRegistryClient({"url": sys.argv[1]})
    subject = "probe-value"
    seen = {}
    first = client.register_schema(subject, Schema(V1, "AVRO"))
    second = client.register_schema(subject, Schema(V2, "AVRO"))
    seen["ids"] = [first, second]
    seen["again"] = client.register_schema(subject, Schema(V1, "AVRO"))
    found = client.lookup_schema(subject, Schema(V1, "AVRO"))
    seen["lookup"] = [found.schema_id, found.version]
    latest = client.get_latest_version(subject)
    seen["latest"] = [latest.schema_id, latest.version]
    seen["version1"] = client.get_version(subject, 1).schema_id
    seen["by_id"] = json.loads(client.get_schema(second).schema_str)["fields"][1]["name"]
    seen["versions"] = client.get_versions(subject)
    seen["global_level"] = client.get_compatibility()
    try:
        client.register_schema(subject, Schema(BREAKS, "AVRO"))
        seen["incompatible"] = "accepted"
    except SchemaRegistryError as e:
        seen["incompatible"] = e.http_status_code
    client.set_compatibility(subject, "NONE")
    seen["subject_level"] = client.get_compatibility(subject)
    seen["after_none"] = client.register_schema(subject, Schema(BREAKS, "AVRO"))
    try:
        client.get_version("nope-value", 1)
        seen["missing"] = "found"
    except SchemaRegistryError as e:
        seen["missing"] = [e.http_status_code, e.error_code]
    seen["deleted_version"] = client.delete_version(subject, 1)
    seen["after_version_delete"] = client.get_versions(subject)
    seen["deleted_subject"] = client.delete_subject(subject)
    try:
        client.get_versions(subject)
        seen["soft_deleted"] = "found"
    except SchemaRegistryError as e:
        seen["soft_deleted"] = e.http_status_code
    seen["purged"] = client.delete_subject(subject, permanent=True)
    seen["reregistered"] = client.register_schema(subject, Schema(V1, "AVRO"))
    seen["fresh_versions"] = client.get_versions(subject)
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()
