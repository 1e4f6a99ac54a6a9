#!/usr/bin/env python3
"""Run MindIE PyMotor's released engine-server /status and virtual inference in front of an
OpenAI-compatible engine.

    scripts/pymotor python tools/npu-chaos/pymotor/engine_server.py \
        --engine-port E --mgmt-port M --model NAME --device-id 0 [--npu-smi PATH]

Serves GET http://127.0.0.1:M/status (and /metrics) with the unmodified code of the installed
`mindie-motor` 3.0.0b2 (scripts/pymotor install); the engine is http://127.0.0.1:E.

Package files relied on (paths inside site-packages/motor/engine_server/):
  core/endpoint.py         Endpoint: FastAPI/uvicorn app with /status and /metrics; starts
                           the virtual inference at the first /status that finds /health true
  core/health_collector.py GET http://<host>:<engine_port>/health per /status, body == "true"
  core/sim_inference.py    the probe POST /v1/completions and the AI Core sampling loop
  utils/aicore.py          `npu-smi info -t usages -i <device_id//2> -c <device_id%2>`
                           (device_id from RANKTABLE_PATH), parses `Aicore Usage Rate(%) : N`
  utils/prometheus.py      setup_multiprocess_prometheus()
  config/base.py           ServerConfig (.validate(), .load_deploy_config()), BaseConfig
  config/config_loader.py  DeployConfig.load(): the MindIE-format user_config.json
  (and motor/common/utils/logger.py: logs to stdout unless the root logger has a handler)

Glue added here, and what each piece replaces:
  * ServerConfig(...) built from our arguments, then its own validate() and
    load_deploy_config() -- replaces ServerConfig.init_engine_server_config(), which parses
    the engine server's CLI (--host --port --mgmt-port --config-path ...) from sys.argv.
  * A BaseConfig subclass whose get_args() returns Namespace(host, port=E,
    served_model_name=[NAME]) -- replaces VLLMConfig (config/vllm.py), whose convert() builds
    vLLM's serve arguments and needs vLLM installed. Those three are all the engine server's
    /status path reads from the args.
  * Endpoint(config).run() -- replaces VLLMServerCore (core/vllm/vllm_core.py via
    cli/main.py), which would also launch vLLM's engine core and the engine server's own
    inference HttpServer (core/http_server.py: /health as a JSON bool, /v1/completions) on
    port E. Here the engine on E is ours, so /health and the probe go to it directly.
  * A temp user_config.json in MindIE's format (motor_engine_prefill_config with
    engine_type vllm, model_config, engine_config {}; motor_deploy_config {} so no TLS) --
    replaces the deployment's ConfigMap; health_check_config is left to its defaults.
  * A temp rank table for RANKTABLE_PATH with the one device_id -- replaces the one the
    Node Manager writes for the engine.
  * --npu-smi: its directory is put first on PATH (through a temp symlink named npu-smi when
    the file has another name), since utils/aicore.py runs `npu-smi` by name. Without it the
    npu-smi on PATH is used; if there is none every sample fails and counts as 0 %.
  * A stderr handler on the root logger installed before the import (the package adds its
    stdout one only when the root has none), and fd 1 / sys.stdout pointed at stderr: all
    logs go to stderr. Level: $PYMOTOR_LOG_LEVEL (default WARNING).
SIGTERM/SIGINT: Endpoint.shutdown(), exit 0. A setup error: one line on stderr, exit 2.
"""

import argparse
import atexit
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine-port", type=int, required=True)
    p.add_argument("--mgmt-port", type=int, required=True)
    p.add_argument("--model", required=True, help="served model name used in the probe")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--npu-smi", help="the npu-smi the engine server runs")
    args = p.parse_args()

    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    try:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s][%(name)s] %(message)s"))
        handler.setLevel(os.environ.get("PYMOTOR_LOG_LEVEL", "WARNING").upper())
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(os.environ.get("PYMOTOR_LOG_LEVEL", "WARNING").upper())
        os.environ.pop("MOTOR_LOG_PATH", None)

        # ServerConfig.validate() refuses a path that is not its own realpath.
        workdir = os.path.realpath(tempfile.mkdtemp(prefix="pymotor-es-"))
        atexit.register(shutil.rmtree, workdir, True)

        if args.npu_smi:
            npu_smi = os.path.realpath(args.npu_smi)
            if not (os.path.isfile(npu_smi) and os.access(npu_smi, os.X_OK)):
                raise ValueError(f"--npu-smi {args.npu_smi} is not an executable file")
            bindir = os.path.dirname(npu_smi)
            if os.path.basename(npu_smi) != "npu-smi":
                bindir = os.path.join(workdir, "bin")
                os.makedirs(bindir)
                os.symlink(npu_smi, os.path.join(bindir, "npu-smi"))
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

        ranktable_path = os.path.join(workdir, "ranktable.json")
        with open(ranktable_path, "w", encoding="utf-8") as f:
            json.dump({"version": "1.0", "status": "completed", "server_count": "1",
                       "server_list": [{"server_id": "127.0.0.1", "container_ip": "127.0.0.1",
                                        "device": [{"device_id": str(args.device_id),
                                                    "device_ip": "127.0.0.1",
                                                    "rank_id": "0"}]}]}, f)
        os.environ["RANKTABLE_PATH"] = ranktable_path

        parallel = {"dp_size": 1, "tp_size": 1, "pp_size": 1, "enable_ep": False,
                    "dp_rpc_port": 9000}
        user_config = {
            "motor_deploy_config": {},
            "motor_engine_prefill_config": {
                "engine_type": "vllm",
                "model_config": {"model_name": args.model, "model_path": args.model,
                                 "npu_mem_utils": 0.9, "prefill_parallel_config": parallel},
                "engine_config": {},
            },
            "motor_engine_decode_config": {"model_config": {"decode_parallel_config": parallel}},
        }
        config_path = os.path.join(workdir, "user_config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(user_config, f)

        # Before anything imports prometheus_client (core/endpoint.py does).
        from motor.engine_server.utils.prometheus import setup_multiprocess_prometheus
        setup_multiprocess_prometheus()

        from motor.engine_server.config.base import BaseConfig, ServerConfig
        from motor.engine_server.core.endpoint import Endpoint

        class EngineArgsConfig(BaseConfig):
            def __init__(self, server_config, engine_args):
                super().__init__(server_config)
                self.engine_args = engine_args

            def get_args(self):
                return self.engine_args

        server_config = ServerConfig(server_host="127.0.0.1", role="union",
                                     server_port=args.mgmt_port, engine_port=args.engine_port,
                                     config_path=config_path)
        server_config.validate()
        server_config.load_deploy_config()
        config = EngineArgsConfig(server_config, argparse.Namespace(
            host="127.0.0.1", port=args.engine_port, served_model_name=[args.model]))

        endpoint = Endpoint(config)
        endpoint.run()
        # uvicorn runs in the Endpoint's thread: a bind failure shows only as that thread dying.
        deadline = time.monotonic() + 15
        while not getattr(endpoint._server, "started", False):
            if not endpoint._server_thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the /status server did not come up on 127.0.0.1:{args.mgmt_port}")
            time.sleep(0.1)
    except Exception as e:  # noqa: BLE001 - one line, whatever it was
        print(f"engine_server: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)

    while not stop.wait(0.2):
        pass
    endpoint.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
