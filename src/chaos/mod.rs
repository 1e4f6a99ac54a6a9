//! The chaos suite (`npu-chaos`, feature `fake-driver`): experiments that inject faults into a
//! stack of real processes — the fake engine, the agent release binary on the fake driver, a
//! load generator, a Node Manager emulator — and check that benign faults never get a healthy
//! engine killed and real faults are always detected. See `docs/chaos.md`.

pub mod experiment;
