"""Reads a Prometheus text exposition on stdin with the reference parser (prometheus_client)
and prints its samples as JSON: [{"name", "type", "labels", "value"}]. Malformed input fails.
"""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families

samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        value = sample.value
        samples.append({
            "name": sample.name,
            "type": family.type,
            "labels": sample.labels,
            # JSON has no infinity; the +Inf bucket's bound is a label, not a value.
            "value": None if math.isnan(value) or math.isinf(value) else value,
        })
json.dump(samples, sys.stdout)
