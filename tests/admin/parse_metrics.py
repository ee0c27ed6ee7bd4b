"""Reads Prometheus text exposition on stdin with prometheus_client's own
parser and prints every sample as JSON: [{"name", "labels", "value"}],
a value that is not a finite number (NaN: not known now) as null.
Exits 1 with the parser's complaint when the text does not parse."""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    text = sys.stdin.read()
    try:
        samples = [
            {
                "name": s.name,
                "labels": s.labels,
                "value": s.value if math.isfinite(s.value) else None,
            }
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except Exception as error:  # the parser's own words
        print(f"parse_metrics.py: {error}", file=sys.stderr)
        sys.exit(1)
    json.dump(samples, sys.stdout)


if __name__ == "__main__":
    main()
