//! The container tier's plan: an overlay of the image's layers, nothing of the host.

use airlock_api::{ImageConfig, ImageRootfs, SandboxConfig, Tier};

use super::*;
use crate::plan::{RootPlan, UserLookup, id_range};

fn root_host() -> HostFacts {
    HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec!["/var/lib/airlock".into()],
    }
}

fn image() -> ImageRootfs {
    ImageRootfs {
        digest: "sha256:0123".into(),
        layers: vec!["/store/layers/a".into(), "/store/layers/b".into()],
        config: ImageConfig {
            env: vec!["PATH=/opt/bin:/bin".into(), "GREETING=image".into()],
            working_dir: Some("/srv".into()),
            user: Some("alice".into()),
            entrypoint: vec!["/bin/entry".into()],
            cmd: vec!["serve".into()],
        },
    }
}

fn config() -> SandboxConfig {
    SandboxConfig::for_image(image(), &[])
}

#[test]
fn test_compile_container_root_is_an_overlay_of_the_layers_without_masks() {
    let plan = compile(&config(), &root_host()).unwrap();
    assert_eq!(
        plan.view.root,
        RootPlan::Overlay {
            layers: image().layers
        }
    );
    assert!(plan.view.masks.is_empty(), "nothing of the host to mask");
    assert_eq!(plan.landlock.write_trees, vec![PathBuf::from("/")]);
    assert!(plan.landlock.read_except.is_empty());
    assert!(plan.has_image_root());
    assert_eq!(plan.process.argv, vec!["/bin/entry", "serve"]);
    assert_eq!(plan.process.cwd, "/srv");
}

#[test]
fn test_compile_container_environment_layers_image_then_caller() {
    let mut config = config();
    config.env.push(("GREETING".into(), "caller".into()));
    let plan = compile(&config, &root_host()).unwrap();
    let get = |name: &str| {
        plan.process
            .env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("PATH").as_deref(), Some("/opt/bin:/bin"));
    assert_eq!(get("GREETING").as_deref(), Some("caller"));
    assert_eq!(get("HOME"), None, "HOME comes from the image's passwd");
    assert_eq!(
        plan.identity.lookup,
        Some(UserLookup {
            spec: Some("alice".into()),
            set_home: true
        })
    );
    config.env.push(("HOME".into(), "/data".into()));
    let plan = compile(&config, &root_host()).unwrap();
    assert!(!plan.identity.lookup.unwrap().set_home);
}

#[test]
fn test_compile_container_refuses_what_it_cannot_run() {
    let host = root_host();
    let mut no_image = config();
    no_image.image = None;
    assert_eq!(compile(&no_image, &host), Err(CompileError::MissingImage));

    let mut process = config();
    process.tier = Tier::Process;
    assert_eq!(
        compile(&process, &host),
        Err(CompileError::ImageOnWrongTier("process"))
    );

    let mut rootfs = config();
    rootfs.rootfs = Some("/srv/root".into());
    assert_eq!(compile(&rootfs, &host), Err(CompileError::RootfsWithImage));

    let mut deep = image();
    deep.layers = (0..501).map(|i| PathBuf::from(format!("/l/{i}"))).collect();
    assert_eq!(
        compile(&SandboxConfig::for_image(deep, &[]), &host),
        Err(CompileError::TooManyLayers(501))
    );
    let mut relative = image();
    relative.layers = vec!["layers/a".into()];
    assert!(matches!(
        compile(&SandboxConfig::for_image(relative, &[]), &host),
        Err(CompileError::RelativePath { .. })
    ));
    let mut none = image();
    none.layers.clear();
    assert_eq!(
        compile(&SandboxConfig::for_image(none, &[]), &host),
        Err(CompileError::NoLayers)
    );

    let mut bare = image();
    bare.config.entrypoint.clear();
    bare.config.cmd.clear();
    assert_eq!(
        compile(&SandboxConfig::for_image(bare, &[]), &host),
        Err(CompileError::NoImageCommand)
    );

    let user = HostFacts {
        caller_uid: 1000,
        caller_gid: 1000,
        state_dirs: vec![],
    };
    assert_eq!(
        compile(&config(), &user),
        Err(CompileError::ContainerNeedsRoot)
    );
}

#[test]
fn test_plan_id_range_moves_only_a_root_callers_map() {
    let mut plan = compile(&config(), &root_host()).unwrap();
    plan.use_id_range(SANDBOX_ID_BASE + 3 * SANDBOX_ID_COUNT);
    assert_eq!(
        plan.identity.uid_map,
        vec![id_range(SANDBOX_ID_BASE + 3 * SANDBOX_ID_COUNT)]
    );
    assert_eq!(plan.identity.gid_map, plan.identity.uid_map);

    let user = HostFacts {
        caller_uid: 1000,
        caller_gid: 1000,
        state_dirs: vec![],
    };
    let mut own = compile(&SandboxConfig::new(vec!["true".into()]), &user).unwrap();
    let before = own.identity.clone();
    own.use_id_range(SANDBOX_ID_BASE + SANDBOX_ID_COUNT);
    assert_eq!(own.identity, before);
}

#[test]
fn test_compile_container_policy_rules_land_as_binds_and_masks() {
    let mut config = config();
    let policy: airlock_api::policy::PolicyDocument = serde_json::from_str(
        r#"{"version":1,"tier":"container","filesystem":{"rules":{"/etc":"ro","/opt/data":"rw","/srv/secret":"deny"},"protect_git":false}}"#,
    )
    .unwrap();
    config.policy = Some(Box::new(policy));
    let plan = compile(&config, &root_host()).unwrap();
    assert_eq!(plan.view.read_only_paths, vec![PathBuf::from("/etc")]);
    assert!(plan.view.masks.iter().any(|m| m.path == "/srv/secret"));
    assert!(
        plan.landlock
            .read_except
            .contains(&"/srv/secret".to_owned())
    );

    let home: airlock_api::policy::PolicyDocument =
        serde_json::from_str(r#"{"version":1,"filesystem":{"rules":{"~/.cache":"rw"}}}"#).unwrap();
    config.policy = Some(Box::new(home));
    assert!(matches!(
        compile(&config, &root_host()),
        Err(CompileError::PolicyUnsupported { .. })
    ));
}
