"""Sets or removes Kafka ACLs with confluent-kafka's AdminClient.

    acl.py --brokers HOST:PORT [--property key=value ...] \
        (deny | allow | remove) --principal User:NAME \
        (--topic NAME | --transactional-id NAME | --cluster) [--operation OP]

`deny` and `allow` add an ACL for OP (default ALL) on the resource;
`remove` deletes every ACL of the principal on it. The properties are the
connection's (a super user's, to be allowed to change ACLs). Exits 1
with the broker's answer when it refuses.
"""

import argparse
import sys

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--property", action="append", default=[])
    parser.add_argument("action", choices=["deny", "allow", "remove"])
    parser.add_argument("--principal", required=True)
    resource = parser.add_mutually_exclusive_group(required=True)
    resource.add_argument("--topic")
    resource.add_argument("--transactional-id")
    resource.add_argument("--cluster", action="store_true")
    parser.add_argument("--operation", default="ALL")
    args = parser.parse_args()

    config = {"bootstrap.servers": args.brokers}
    for item in args.property:
        key, _, value = item.partition("=")
        config[key] = value
    admin = AdminClient(config)

    if args.topic is not None:
        kind, name = ResourceType.TOPIC, args.topic
    elif args.transactional_id is not None:
        kind, name = ResourceType.TRANSACTIONAL_ID, args.transactional_id
    else:
        kind, name = ResourceType.BROKER, "kafka-cluster"

    if args.action == "remove":
        selector = AclBindingFilter(
            kind,
            name,
            ResourcePatternType.LITERAL,
            args.principal,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        futures = admin.delete_acls([selector])
    else:
        permission = AclPermissionType.DENY if args.action == "deny" else AclPermissionType.ALLOW
        binding = AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            args.principal,
            "*",
            AclOperation[args.operation],
            permission,
        )
        futures = admin.create_acls([binding])
    for future in futures.values():
        try:
            future.result(timeout=30)
        except Exception as error:  # the broker's refusal, as it said it
            print(f"acl.py: {args.action} refused: {error}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
