"""Calls soulbased's gRPC API with grpcio, a standard client (not ours): decodes
each refusal with grpcio-status (`google.rpc.Status`, `google.rpc.ErrorInfo`) and
lists the services through grpcio-reflection (`grpc.reflection.v1alpha`). Prints
one JSON document for the Rust test (crates/soulbased/tests/conformance.rs).

Usage: python grpcio_refusals.py HOST:PORT < cases.json
where cases.json is a list of {"name", "method", "request" (hex of the encoded
request message), "metadata" ([[key, value], ...])}.
"""

import json
import sys

import grpc
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status


def answer(channel, case):
    call = channel.unary_unary(case["method"])
    try:
        call(
            bytes.fromhex(case["request"]),
            metadata=[tuple(m) for m in case["metadata"]],
            timeout=20,
        )
        return {"name": case["name"], "ok": True}
    except grpc.RpcError as e:
        status = rpc_status.from_call(e)
        out = {
            "name": case["name"],
            "grpc_code": e.code().name,
            "status_code": status.code if status else None,
            "call_id": dict(e.trailing_metadata() or []).get("x-soulbase-call-id"),
        }
        for detail in status.details if status else []:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                out["reason"] = info.reason
                out["domain"] = info.domain
                out["metadata"] = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                out["bad_fields"] = [v.field for v in bad.field_violations]
        return out


def main(target):
    cases = json.load(sys.stdin)
    with grpc.insecure_channel(target) as channel:
        services = sorted(ProtoReflectionDescriptorDatabase(channel).get_services())
        answers = [answer(channel, c) for c in cases]
    print(json.dumps({"services": services, "answers": answers}))


if __name__ == "__main__":
    main(sys.argv[1])
