#!/usr/bin/env python3
"""Run MindIE PyMotor's real Node Manager HeartbeatManager alone against one endpoint.

    scripts/pymotor python tools/npu-chaos/pymotor/node_manager.py \
        --mgmt-port P --business-port B [--heartbeat-interval 1]

The HeartbeatManager is imported unmodified from the installed `mindie-motor` 3.0.0b2
(scripts/pymotor install). It polls GET http://127.0.0.1:P/status and reports to a controller.

Package files relied on (paths inside site-packages/motor/):
  node_manager/core/heartbeat_manager.py    HeartbeatManager: start(), update_endpoint(),
                                            should_suicide(), heartbeat_interval_seconds,
                                            _consecutive_abnormal_count, _is_within_grace_period
                                            (grace period: the literal 60 s in
                                            _get_engine_server_status)
  node_manager/api_client/engine_server_api_client.py   the poll (literal timeout=2 s)
  node_manager/api_client/controller_api_client.py      POST /controller/heartbeat; reads
                                            ControllerConfig/NodeManagerConfig at import
  config/node_manager.py, config/controller.py          NodeManagerConfig.from_json(),
                                            ControllerConfig.from_json() (USER_CONFIG_PATH)
  common/utils/env.py                       env vars: USER_CONFIG_PATH, CONTROLLER_SERVICE,
                                            ROLE, JOB_NAME (BasicConfig reads JOB_NAME at import)
  common/resources/http_msg_spec.py         StartCmdMsg, Ranktable, ServerInfo
  common/resources/endpoint.py              Endpoint, DeviceInfo
  common/utils/logger.py                    logs to stdout unless the root logger already
                                            has a handler

Glue added here, and what each piece replaces:
  * A tiny HTTP server on a free 127.0.0.1 port answering POST /controller/heartbeat with
    200 `{}` -- replaces the Controller's API server (motor/controller/api_server). The body
    must be JSON: the package's client calls .json() on it and a failure skips the counter.
  * A temp user_config.json in MindIE's format (motor_controller_config.api_config.
    controller_api_port = that port; motor_nodemanger_config.basic_config.
    heartbeat_interval_seconds, the package's own key, spelling included) plus the env vars
    above, set BEFORE the import -- replaces the deployment's ConfigMap and pod env.
    --heartbeat-interval goes through that config path (NodeManagerConfig.from_json(), what
    HeartbeatManager() does when given no config); the package requires an int > 0.
  * update_endpoint(StartCmdMsg(...)) with one Endpoint(0, 127.0.0.1, B, P) and a one-device
    ranktable, then start() -- replaces the Controller's start command (POST
    /node-manager/start in node_manager/api_server/node_manager_api.py, which also pulls
    the engines first; nothing is pulled here).
  * A 0.1 s poll of should_suicide() -- replaces node_manager/main.py's loop, which would
    run suicide_procedure() (kill the engines); here we print an event and exit 0.
  * stdout kept for our JSON lines only: fd 1 and sys.stdout are pointed at stderr, since
    the package logs to sys.stdout (ControllerConfig.from_json() reinstalls that handler
    through reconfigure_logging()); its log level is set through the same user_config.json
    (motor_controller_config.logging_config.log_level = $PYMOTOR_LOG_LEVEL, default WARNING).

Output: one JSON object per line on stdout, flushed, each with "t" = seconds since start()
(monotonic):
  {"event":"started","grace_s":60,"heartbeat_s":N,"poll_timeout_s":2}
  {"event":"grace_over"}         when the manager's own grace flag turns off
  {"event":"heartbeat","status":{"0":"normal"},"count":K}  per POST received; t is when it
        arrived, count is the manager's consecutive-abnormal counter once it has processed
        the 200 (read from the attribute; null if unreadable)
  {"event":"suicide"}            first time should_suicide() is true, then exit 0
  {"event":"error","message":...} on a setup error, exit 2
SIGTERM/SIGINT: exit 0.
"""

import argparse
import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Facts from the package source (literals there, not readable attributes).
GRACE_S = 60  # heartbeat_manager.py: `elapsed_time < 60`
POLL_TIMEOUT_S = 2  # engine_server_api_client.py: SafeHTTPSClient(..., timeout=2)

_print_lock = threading.Lock()
_stop = threading.Event()
_t0 = None  # monotonic time of start()
_out = sys.stdout  # where our JSON lines go (a dup of the original stdout once main() runs)


def emit(event, t=None, **fields):
    if t is None:
        t = time.monotonic() - _t0 if _t0 is not None else 0.0
    line = json.dumps({"event": event, "t": round(t, 3), **fields})
    with _print_lock:
        _out.write(line + "\n")
        _out.flush()


def fail(message):
    emit("error", message=str(message))
    sys.exit(2)


class Controller:
    """The controller side: records each heartbeat body and answers 200."""

    def __init__(self):
        self.manager = None
        self.bodies = []
        self.pending = 0  # heartbeat events not yet printed
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                arrived = time.monotonic()
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                if self.path != "/controller/heartbeat":
                    self._reply(404, b'{"detail":"not found"}')
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"raw": raw.decode("utf-8", "replace")}
                with outer.cond:
                    outer.bodies.append(body)
                    outer.pending += 1
                before = outer.count()
                self._reply(200, b"{}")
                outer.report(body, arrived, before)

            def _reply(self, code, payload):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def serve(self):
        threading.Thread(target=self.server.serve_forever, daemon=True, name="controller").start()

    def count(self):
        try:
            return int(self.manager._consecutive_abnormal_count)
        except Exception:
            return None

    def report(self, body, arrived, before):
        status = body.get("status") if isinstance(body, dict) else None
        # The manager updates its counter right after our 200 (+1 if any endpoint it sent is
        # abnormal, else 0); wait up to 1 s for that, then read the counter itself.
        count = before
        if before is not None and self.manager is not None:
            abnormal = isinstance(status, dict) and "abnormal" in status.values()
            want = before + 1 if abnormal else 0
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                count = self.count()
                if count == want:
                    break
                time.sleep(0.005)
        t = arrived - _t0 if _t0 is not None else 0.0
        emit("heartbeat", t=t, status=status, count=count)
        with self.cond:
            self.pending -= 1
            self.cond.notify_all()

    def drain(self, timeout):
        with self.cond:
            self.cond.wait_for(lambda: self.pending == 0, timeout=timeout)


def main():
    global _t0, _out
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mgmt-port", type=int, required=True, help="the endpoint's /status port")
    p.add_argument("--business-port", type=int, required=True)
    p.add_argument("--heartbeat-interval", type=int, default=None,
                   help="seconds, an int > 0 (the package's default is 1)")
    args = p.parse_args()

    _out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    log_level = os.environ.get("PYMOTOR_LOG_LEVEL", "WARNING").upper()

    def on_signal(_sig, _frame):
        _stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        if args.heartbeat_interval is not None and args.heartbeat_interval <= 0:
            raise ValueError("--heartbeat-interval must be an int > 0")
        for name, port in (("--mgmt-port", args.mgmt_port), ("--business-port", args.business_port)):
            if not 0 < port < 65536:
                raise ValueError(f"{name} out of range: {port}")

        controller = Controller()
        controller.serve()

        workdir = tempfile.mkdtemp(prefix="pymotor-nm-")  # no hccl.json beside the config
        atexit.register(shutil.rmtree, workdir, True)
        user_config = {
            "motor_controller_config": {"api_config": {"controller_api_port": controller.port},
                                        "logging_config": {"log_level": log_level}},
            "motor_nodemanger_config": {"basic_config": {}},
            "motor_engine_prefill_config": {
                "model_config": {"model_name": "chaos", "prefill_parallel_config": {}}
            },
            "motor_deploy_config": {"hardware_type": "800I-A3"},
        }
        if args.heartbeat_interval is not None:
            user_config["motor_nodemanger_config"]["basic_config"][
                "heartbeat_interval_seconds"] = args.heartbeat_interval
        config_path = os.path.join(workdir, "user_config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(user_config, f)

        os.environ.update({
            "CONTROLLER_SERVICE": "127.0.0.1",
            "USER_CONFIG_PATH": config_path,
            "ROLE": "prefill",
            "JOB_NAME": "npu-chaos",
            "POD_IP": "127.0.0.1",
        })
        os.environ.pop("HCCL_PATH", None)
        os.environ.pop("MOTOR_LOG_PATH", None)

        from motor.common.resources.endpoint import DeviceInfo, Endpoint
        from motor.common.resources.http_msg_spec import Ranktable, ServerInfo, StartCmdMsg
        from motor.node_manager.core.heartbeat_manager import HeartbeatManager

        manager = HeartbeatManager()  # config=None: NodeManagerConfig.from_json()
        controller.manager = manager
        heartbeat_s = manager.heartbeat_interval_seconds
        if args.heartbeat_interval is not None and heartbeat_s != args.heartbeat_interval:
            raise RuntimeError(f"the package did not take heartbeat_interval_seconds="
                               f"{args.heartbeat_interval} (it has {heartbeat_s})")

        endpoint = Endpoint(0, "127.0.0.1", str(args.business_port), str(args.mgmt_port))
        ranktable = Ranktable(version="1.0", status="completed", server_count="1", server_list=[
            ServerInfo(server_id="127.0.0.1", container_ip="127.0.0.1", device=[
                DeviceInfo(device_id="0", device_ip="127.0.0.1", rank_id="0")])])
        manager.update_endpoint(StartCmdMsg(job_name="npu-chaos", role="prefill", instance_id=0,
                                            endpoints=[endpoint], ranktable=ranktable))
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - one line, whatever it was
        fail(f"{type(e).__name__}: {e}")

    if _stop.is_set():
        sys.exit(0)
    _t0 = time.monotonic()
    manager.start()
    emit("started", grace_s=GRACE_S, heartbeat_s=heartbeat_s, poll_timeout_s=POLL_TIMEOUT_S)

    grace_announced = False
    while not _stop.wait(0.1):
        if not grace_announced:
            flag = getattr(manager, "_is_within_grace_period", None)
            over = (flag is False) if flag is not None else (time.monotonic() - _t0 >= GRACE_S)
            if over:
                emit("grace_over")
                grace_announced = True
        if manager.should_suicide():
            t = time.monotonic() - _t0
            controller.drain(timeout=1.5)  # let the heartbeat that set it print first
            emit("suicide", t=t)
            sys.exit(0)
    sys.exit(0)


if __name__ == "__main__":
    main()
