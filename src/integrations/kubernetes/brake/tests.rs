use super::*;
use config::{BrakeConfig as Settings, DEFAULT_NAME};

// The loop's step as a table: it consults only for a held engine whose configured judging
// says abnormal while /status does not, when due; it releases an acting engine once the
// configured verdict is normal again, and never otherwise (an engine abnormal before the
// brake engaged keeps its verdict).
#[test]
fn the_loop_consults_only_for_a_held_new_verdict_and_releases_only_a_normal_one() {
    use Gate::{Acting, Held, Off};
    use Step::{Consult, Release, Wait};
    let rows = [
        (Held, true, false, true, Consult),
        (Held, true, false, false, Wait),
        (Held, true, true, true, Wait),
        (Held, false, false, true, Wait),
        (Acting, true, true, true, Wait),
        (Acting, false, false, true, Release),
        (Off, true, false, true, Wait),
    ];
    for (gate, configured, answered, due, want) in rows {
        assert_eq!(
            step(gate, configured, answered, due),
            want,
            "{gate:?} {configured} {answered} {due}"
        );
    }
}

#[allow(dead_code, unreachable_pub)]
#[path = "../../../../tests/support/kube_api.rs"]
pub(super) mod stand_in;

use crate::integrations::kubernetes::brake::client::{Consulted, consult, count};
use stand_in::{StandIn, TOKEN, pod};

/// The tests' runtime (the stand-in runs its own, which must not start or stop inside it).
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A client of `url` with the stand-in's token, and the brake's settings for `fleet`.
fn client(url: &str, fleet: config::Fleet) -> (KubeClient, BrakeConfig, Home) {
    let dir = std::env::temp_dir().join(format!(
        "brake-{}-{}",
        std::process::id(),
        url.replace([':', '/', '.'], "")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let k = KubernetesConfig {
        api_server: Some(url.to_owned()),
        token_file: Some(token),
        request_timeout: Duration::from_secs(2),
        ..KubernetesConfig::default()
    };
    let cfg = BrakeConfig {
        enabled: true,
        fleet,
        ..BrakeConfig::default()
    };
    let home = Home {
        namespace: "npu-health".to_owned(),
        name: config::DEFAULT_NAME.to_owned(),
    };
    (KubeClient::new(&k).unwrap(), cfg, home)
}

fn pods(n: usize, ns: &str) -> Vec<k8s_openapi::api::core::v1::Pod> {
    (0..n)
        .map(|i| pod(ns, &format!("vllm-{i}"), &format!("node-{i}"), false, &[]))
        .collect()
}

fn namespace(ns: &str) -> config::Fleet {
    config::Fleet {
        namespace: Some(ns.to_owned()),
        selector: None,
    }
}

// The fleet's engines are counted as its pods: one `limit=1` request with
// `remainingItemCount` for a namespace, pages for a label selector (which the API server
// answers without that count).
#[test]
fn the_fleet_is_counted_in_one_request_or_in_pages_with_a_selector() {
    let s = StandIn::start(pods(1203, "serving"));
    rt().block_on(async {
        let (c, cfg, _) = client(&s.url, namespace("serving"));
        let mut t = Tally::default();
        assert_eq!(count(&c, &cfg, &mut t).await.unwrap(), 1203);
        assert_eq!(t.requests, 1);
        let (c, cfg, _) = client(
            &s.url,
            config::Fleet {
                namespace: None,
                selector: Some("app=vllm".to_owned()),
            },
        );
        let mut t = Tally::default();
        assert_eq!(count(&c, &cfg, &mut t).await.unwrap(), 1203);
        assert_eq!(t.requests, 3, "pages of {}", client::PAGE);
    });
}

// Twenty engines of a fleet of ten consult at once: no patch conflicts (the API server
// applies them one at a time), every consult ends, exactly five verdicts act (more than
// half engages).
#[test]
fn concurrent_consults_never_conflict_and_let_exactly_the_fraction_act() {
    let s = StandIn::start(pods(10, "serving"));
    rt().block_on(async {
        let (c, cfg, home) = client(&s.url, namespace("serving"));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..20 {
            let (c, cfg, home) = (c.clone(), cfg.clone(), home.clone());
            tasks.spawn(async move {
                let mut t = Tally::default();
                let e = format!("node-{i}/e");
                let r = consult(&c, &cfg, &home, &e, 1_000_000, None, &mut t).await;
                (r, t)
            });
        }
        let (mut acted, mut conflicts) = (0, 0);
        while let Some(done) = tasks.join_next().await {
            let (r, t) = done.unwrap();
            let Consulted { decision, .. } = r.expect("every consult ends");
            acted += u32::from(decision == Decision::Act);
            conflicts += t.conflicts;
        }
        assert_eq!(acted, 5);
        let counts = s.api.config_map_counts();
        assert_eq!(conflicts, 0, "no patch refused for a conflict");
        assert_eq!(
            counts.creates - counts.conflicts,
            1,
            "one create; the others found it made (409 AlreadyExists) and patched it"
        );
        let cm = s
            .api
            .config_map("npu-health", config::DEFAULT_NAME)
            .unwrap();
        let (f, bad) = Fleet::of_data(&cm.data.unwrap());
        assert_eq!((f.trips.len(), f.engines, bad), (20, 10, None));
        assert_eq!(f.trips.values().filter(|t| t.acted).count(), 5);
        assert!(f.engaged(1_000_000, 300, 0.5));
    });
}

// An engine whose verdict acted in the window acts again when its agent restarts (it reads
// the state first, writes nothing); trips past the window are removed by the next patch; a
// count older than `count_every` is taken again, by the one agent whose claim held.
#[test]
fn a_restarted_agent_keeps_its_verdict_and_old_trips_and_counts_go() {
    let s = StandIn::start(pods(4, "serving"));
    rt().block_on(async {
        let (c, cfg, home) = client(&s.url, namespace("serving"));
        let at = 1_000_000;
        for e in ["a/e", "b/e", "c/e"] {
            let r = consult(&c, &cfg, &home, e, at, None, &mut Tally::default()).await;
            let want = if e == "c/e" {
                Decision::Hold
            } else {
                Decision::Act
            };
            assert_eq!(r.unwrap().decision, want, "{e}");
        }
        let before = s.api.config_map_counts();
        let mut t = Tally::default();
        let r = consult(&c, &cfg, &home, "a/e", at + 10, None, &mut t).await;
        assert_eq!(r.unwrap().decision, Decision::Act);
        assert_eq!(
            (t.requests, s.api.config_map_counts().patches),
            (1, before.patches)
        );
        let later = at + cfg.window.as_secs() + 1;
        let mut t = Tally::default();
        let r = consult(&c, &cfg, &home, "d/e", later, None, &mut t)
            .await
            .unwrap();
        assert_eq!(r.decision, Decision::Act);
        // The read, the trip (which removes the three old ones), the claim, the count, the
        // decision.
        assert_eq!(t.requests, 5);
        assert_eq!(r.fleet.trips.keys().collect::<Vec<_>>(), ["trip.d_e"]);
        assert_eq!(r.fleet.counted, Some(later));
        // The claim on a count: of two agents that saw the same, one holds it.
        let mut t = Tally::default();
        let first = client::claim(&c, &home, Some(later), later + 400, &mut t).await;
        let second = client::claim(&c, &home, Some(later), later + 400, &mut t).await;
        assert_eq!((first.unwrap(), second.unwrap()), (true, false));
        assert_eq!(s.api.config_map_counts().patch_refused, 1);
    });
}

// Trips that left the window are removed only as they were seen: an engine that tripped
// again since keeps its new trip (the removal's `test` fails, the rest is written alone).
#[test]
fn an_old_trip_is_removed_only_if_it_did_not_trip_again() {
    let s = StandIn::start(pods(4, "serving"));
    rt().block_on(async {
        let (c, cfg, home) = client(&s.url, namespace("serving"));
        let (at, w) = (1_000_000, cfg.window.as_secs());
        let mut t = Tally::default();
        consult(&c, &cfg, &home, "a/e", at, None, &mut t)
            .await
            .unwrap();
        consult(&c, &cfg, &home, "b/e", at, None, &mut t)
            .await
            .unwrap();
        let stale = client::read(&c, &home, &mut t).await.unwrap().unwrap().0;
        consult(&c, &cfg, &home, "a/e", at + w + 1, None, &mut t)
            .await
            .unwrap();
        let engines = |n: u64| {
            vec![serde_json::json!({"op": "add", "path": "/data/engines", "value": n.to_string()})]
        };
        let f = client::write_pruning(&c, &home, &stale, engines(7), at + w + 2, w, &mut t)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(f.engines, 7);
        assert_eq!(
            f.trips.get("trip.a_e").map(|t| t.at),
            Some(at + w + 1),
            "kept"
        );
        // Seen as it is now, the old trip of b goes.
        let f = client::write_pruning(&c, &home, &f, engines(8), at + w + 2, w, &mut t)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(f.trips.keys().collect::<Vec<_>>(), ["trip.a_e"]);
        assert_eq!(f.engines, 8);
    });
}

// The API server down: the consult fails, the verdict stays held (fail closed), and the
// record says why; the engine asks again after a wait.
#[test]
fn with_the_api_server_down_the_verdict_stays_held() {
    rt().block_on(async {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (c, cfg, home) = client(&format!("http://127.0.0.1:{port}"), namespace("serving"));
        let mut t = Tally::default();
        let r = consult(&c, &cfg, &home, "node-0/e", 1_000_000, None, &mut t).await;
        assert!(matches!(r, Err(BrakeError::Api(_))), "{r:?}");
        let mut m = crate::monitor::evidence::tests::engine("policy = \"agent\"\n");
        m.hold_under_brake().unwrap();
        let mut ep = Episode::default();
        let wait = settle(&m, &cfg, &mut ep, r, 1_000_000);
        assert_eq!(m.gate(), Gate::Held);
        let rec = m.brake_record().unwrap();
        assert_eq!((rec.holds, rec.acted), (1, 0));
        assert!(rec.last_error.is_some());
        assert!(wait >= RETRY_AFTER_ERROR);
    });
}

/// A braked engine whose configured judging is abnormal by rule 5 (its `/health` answers).
fn engine_turning_abnormal() -> Arc<Monitor> {
    use crate::monitor::account::Accounted;
    let mut m = crate::monitor::evidence::tests::engine("policy = \"agent\"\n");
    m.hold_under_brake().unwrap();
    m.record_health(&crate::probe::health::HealthOutcome::Healthy, true);
    m.vi().apply_shadow(
        &Accounted {
            accounting: crate::probe::outcome::Accounting::Incremented,
            count: 2,
            abnormal: Some("2 consecutive failures confirmed".to_owned()),
            why: None,
            stalled: None,
        },
        Some(5),
        None,
    );
    Arc::new(m)
}

/// Waits (at most 10 s) until `f` holds.
async fn until(f: impl Fn() -> bool) -> bool {
    for _ in 0..200 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

// The loops of two engines of a fleet of two: the first new verdict acts (half may), the
// second is held and answers as the reference; `/status/detail`'s record says which and why.
#[test]
fn the_loop_lets_the_allowed_verdicts_act_and_holds_the_next() {
    let s = StandIn::start(pods(2, "serving"));
    rt().block_on(async {
        let (c, cfg, home) = client(&s.url, namespace("serving"));
        let cancel = CancellationToken::new();
        let run_one = |node: &str| {
            let m = engine_turning_abnormal();
            let b = Arc::new(Brake {
                cfg: cfg.clone(),
                home: home.clone(),
                node: node.to_owned(),
            });
            tokio::spawn(run(c.clone(), b, m.clone(), cancel.clone()));
            m
        };
        let a = run_one("node-a");
        assert!(
            until(|| a.gate() == Gate::Acting).await,
            "{:?}",
            a.brake_record()
        );
        assert_eq!(a.peek_status(), Status::Abnormal);
        let b = run_one("node-b");
        assert!(until(|| b.brake_record().is_some_and(|r| r.holds == 1)).await);
        assert_eq!((b.gate(), b.peek_status()), (Gate::Held, Status::Normal));
        let r = b.brake_record().unwrap();
        assert!(r.engaged && r.reason.starts_with("2 of 2 engines"), "{r:?}");
        assert_eq!(a.gate(), Gate::Acting, "the first keeps its verdict");
        cancel.cancel();
    });
}

fn parsed_brake(text: &str) -> Result<Settings, String> {
    let c: Settings = toml::from_str(text).map_err(|e| e.to_string())?;
    c.validate().map_err(|(k, m)| format!("{k}: {m}"))?;
    Ok(c)
}

#[test]
fn the_defaults_are_off_half_the_fleet_in_five_minutes() {
    let c = parsed_brake("").unwrap();
    assert!(!c.enabled);
    assert_eq!((c.max_fraction, c.window), (0.5, Duration::from_secs(300)));
    assert_eq!(c.name, DEFAULT_NAME);
}

#[test]
fn each_bad_value_is_refused_with_its_key() {
    for (text, key) in [
        ("enabled = true", "brake.fleet"),
        ("max_fraction = 0.0", "brake.max_fraction"),
        ("max_fraction = 1.5", "brake.max_fraction"),
        ("window = \"10s\"", "brake.window"),
        ("name = \"Brake!\"", "brake.name"),
        (
            "fleet = { namespace = \"Not_A_Label\" }",
            "brake.fleet.namespace",
        ),
        ("fleet = { selector = \"app=v*\" }", "brake.fleet.selector"),
        ("retries = 51", "brake.retries"),
    ] {
        let e = parsed_brake(text).unwrap_err();
        assert!(e.starts_with(key), "{text}: {e}");
    }
    let e = parsed_brake("fleet = { nmespace = \"a\" }").unwrap_err();
    assert!(e.contains("nmespace"), "{e}");
    assert!(parsed_brake("enabled = true\nfleet = { selector = \"app=vllm\" }").is_ok());
}
