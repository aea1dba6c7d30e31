"""The EDS file Envoy watches for a cluster rendered with `render.py --eds NAME=FILE`.

Envoy re-reads the file when it is moved into its directory, so a new list is written to a
temporary file beside it and renamed over it: Envoy never sees half a file.
"""
import json
import os


def write(path, cluster, addresses):
    """Makes `addresses` (["ip:port", ...]) the endpoints of `cluster`."""
    hosts = []
    for addr in addresses:
        host, _, port = addr.rpartition(":")
        hosts.append({"endpoint": {"address": {"socket_address": {
            "address": host.strip("[]"), "port_value": int(port)}}}})
    doc = {"version_info": str(len(addresses)), "resources": [{
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": hosts}] if hosts else []}]}
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
