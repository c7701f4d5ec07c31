// Build graph of the images. Pins come from docker-bake.pins.json, which the pin tool renders from
// versions.json (python3 -m tools.pins render; verify fails while it is stale), passed as a second file:
//
//   docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json base      # the base image
//   TRACK=0.32 docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json serve  # another release track
//   docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json validate  # print-only check targets
//
// Images for a registry (what CI runs; --print shows the tags, cache refs and attestations):
//
//   PUSH=1 REGISTRY=ghcr.io/org/rocm-vllm TAG=main VCS_REF=$(git rev-parse HEAD) \
//     docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json base serve ci
//
// docker-bake.pins.json's top-level keys become bake variables: build_args ("<track>/<ARG>"), aiter_pin_args
// ("<pin>/<ARG>"), the unresolved lists ("<track>/<target>", "<pin>/<target>"), tracks and default_track.
// This file reads them and computes no pin; without that file every target fails with "There is no
// variable named ...". Settings below can be overridden from the environment, e.g. GPU_ARCHS=gfx942.

variable "REGISTRY" { default = "localhost/rocm-vllm" }
variable "TAG" { default = "dev" }
// Release track to build: one of tracks (default: default_track, the newest).
variable "TRACK" { default = default_track }
// TRACK when the pins file renders it; else bake stops in one line naming it and the known tracks
// (base64decode's error carries the text: no string with a space is base64).
function "known_track" {
  params = []
  result = contains(tracks, TRACK) ? TRACK : base64decode("TRACK=${TRACK} is no release track of versions.json; the tracks: ${join(", ", tracks)}")
}
// AITER pin to build: a key of aiter.pins in versions.json (default: the track's).
variable "AITER_PIN" { default = track_aiter_pins[known_track()] }
function "known_aiter_pin" {
  params = []
  result = contains(aiter_pins, AITER_PIN) ? AITER_PIN : base64decode("AITER_PIN=${AITER_PIN} is no pin of aiter.pins in versions.json; the pins: ${join(", ", aiter_pins)}")
}
// GPU archs to build kernels for, ';'-separated; default: versions.json's gpu_archs.
variable "GPU_ARCHS" { default = track_build_args.GPU_ARCHS }
// "1" accepts UNRESOLVED pins (development images, never a release); "0": pins_check stops bake.
variable "ALLOW_UNRESOLVED" { default = "0" }
// Empty: derived from the builder's CPUs and memory at build time.
variable "MAX_JOBS" { default = "" }
variable "AITER_MEM_PER_JOB_GIB" { default = "4" }
// The index AITER's own requirements are installed from (their hash lock): PyPI's, or a mirror of it.
variable "PYPI_INDEX_URL" { default = "https://pypi.org/simple" }
// Revision of this repository, recorded as an OCI label (CI sets it: VCS_REF=$(git rev-parse HEAD)).
variable "VCS_REF" { default = "" }
// "1": images for a registry, pushed with the tags of image_tags; registry build cache (CACHE_REPO)
// and attestations (ATTEST) default on.
variable "PUSH" { default = "0" }
// Registry build cache: one ref per target, <CACHE_REPO>:<cache_key>, exported with mode=max.
// Empty: none (default with PUSH=1: <REGISTRY>/buildcache).
variable "CACHE_REPO" { default = PUSH == "1" ? "${REGISTRY}/buildcache" : "" }
// "1": SBOM and provenance (mode=max) attestations (a docker-container builder; default: PUSH).
variable "ATTEST" { default = PUSH }
// Further cache import/export, e.g. CACHE_FROM=type=local,src=/var/cache/rocm-vllm
variable "CACHE_FROM" { default = "" }
variable "CACHE_TO" { default = "" }
// vLLM image to embed the backend into instead of building vLLM (Dockerfile.rocm); empty: build it.
// Set, the serve and ci targets build on it alone: no base target, no base or AITER pin read (the
// build checks the image's vLLM and AITER against what the backend supports instead).
variable "VLLM_IMAGE" { default = "" }
// "error": the vLLM build stops when the base's AITER lacks a function vLLM calls; "warn": it reports.
variable "AITER_CALLS_CHECK" { default = "error" }
// CA bundle handed to builds as the secret "ca-bundle" (git and pip behind a TLS-inspecting proxy).
variable "CA_BUNDLE" { default = "/etc/ssl/certs/ca-certificates.crt" }

// The values of a flat object of the pins file whose keys are "<prefix>/<NAME>", by NAME.
function "under" {
  params = [flat, prefix]
  result = { for key, value in flat : element(split("/", key), 1) => value if element(split("/", key), 0) == prefix }
}

// The track's build args as rendered: its own AITER pin and ALLOW_UNRESOLVED=0. Read once, as a
// variable's value (bake evaluates a function at every use: the lookup in every attribute made one bake
// --print take seconds). Lower case, as the pins file's: data, not a setting.
variable "track_build_args" { default = under(build_args, known_track()) }

// Every pin's build arg for the track and AITER_PIN; with ALLOW_UNRESOLVED=1 the image without its
// missing digest. Settings (GPU_ARCHS, ...) are bake variables of their own.
variable "pin_build_args" {
  default = merge(track_build_args, under(aiter_pin_args, known_aiter_pin()),
    ALLOW_UNRESOLVED == "1" ? under(build_args_unresolved_allowed, known_track()) : {})
}

// Tags of a target. Local (PUSH=0): <name>:<TAG>-vllm<track>, and <name>:<TAG> for the default
// track. Pushed (PUSH=1): <name>:<commit_tag>, and the floating TAG (a branch or git tag name) when
// set: <name>:<TAG> for the default track, <name>:<TAG>-vllm<track> for another.
function "image_tags" {
  params = [name]
  result = PUSH == "1" ? pushed_tags("${REGISTRY}/${name}", built_on()) : concat(
    ["${REGISTRY}/${name}:${TAG}-vllm${TRACK}"],
    TRACK == default_track ? ["${REGISTRY}/${name}:${TAG}"] : [])
}

// Tags of a pushed image: its commit tag and, when TAG is set, the floating tag.
function "pushed_tags" {
  params = [image, on]
  result = distinct(concat(
    ["${image}:${commit_tag(VCS_REF, on)}"],
    TAG == "" ? [] : [TRACK == default_track ? "${image}:${TAG}" : "${image}:${TAG}-vllm${TRACK}"]))
}

// The 12 hex of the AITER commit the build compiles (UNRESOLVED while the pin has none).
function "aiter_short" {
  params = []
  result = substr(pin_build_args.AITER_COMMIT, 0, 12)
}

// What a vLLM target is built on, in its tags and cache keys: aiter<12 hex of the AITER commit>, or
// with VLLM_IMAGE image<12 hex of the sha256 of its reference> (the image's AITER is not this build's).
function "built_on" {
  params = []
  result = VLLM_IMAGE != "" ? "image${substr(sha256(VLLM_IMAGE), 0, 12)}" : "aiter${aiter_short()}"
}

// Tag of a pushed build: what it holds (the track's vLLM version, then built_on or "cpu") and the commit
// it was built from. A revision that is not a full commit id stops bake, naming VCS_REF.
function "commit_tag" {
  params = [revision, on]
  result = length(regexall("^[0-9a-f]{40}$", revision)) == 1 ? "vllm${track_build_args.VLLM_VERSION}-${on}-${substr(revision, 0, 12)}" : no_value().VCS_REF_must_be_the_full_40_hex_commit_id_with_PUSH_1
}

// An empty object: reading an attribute of it stops bake with that attribute's name as the message.
function "no_value" {
  params = []
  result = {}
}

// ---------------------------------------------------------------- unresolved pins
// A target that builds from a null pin stops bake before anything is pulled or built, in one line
// naming those pins and the command that resolves them, unless ALLOW_UNRESOLVED=1. Each ROCm target
// inherits pins_check's result: the empty target below, else that line, which bake prints as
// "ERROR: failed to find target <the line>". bake resolves inherits only for the targets asked for
// and their contexts (target:base), so the CPU targets (no ROCm pin) are never stopped by it.
// (Variable validation blocks would stop every target alike, and buildx 0.13 has none.)
target "_pins_resolved" {}

function "pins_check" {
  params = [name, pins]
  result = length(pins) == 0 || ALLOW_UNRESOLVED == "1" ? "_pins_resolved" : "${name} (track ${TRACK}): it builds from ${length(pins)} unresolved pin(s) of versions.json: ${join(", ", pins)}: run python3 -m tools.pins resolve --write on a machine that reaches GitHub, PyPI, the container registry and ${stack() == "therock" ? "TheRock's wheel index" : "the PyTorch wheel index"}, or set ALLOW_UNRESOLVED=1 for a development image"
}

// The track's ROCm stack: rocm-image or therock, the stages Dockerfile.rocm_base's ROCM_STACK picks.
function "stack" {
  params = []
  result = track_build_args.ROCM_STACK
}

// The unresolved pins a ROCm target builds from, as rendered: base-aiter-src (the verified AITER source),
// base (the base image) or vllm (vLLM built here: vllm, serve, ci); the track's and AITER_PIN's.
function "unresolved" {
  params = [target]
  result = concat(unresolved_pins["${known_track()}/${target}"], aiter_pin_unresolved["${known_aiter_pin()}/${target}"])
}

// Build cache key of a target, from what its layers depend on: the base's has no vLLM version (a
// vLLM bump keeps the AITER layers' cache); vLLM targets' add it (a track has one stack); a CPU
// image's (<name>-cpu) is <name>-cpu-vllm<vLLM version> (no AITER, no GPU archs).
function "cache_key" {
  params = [name]
  result = name == "base" ? "base-${stack()}-aiter${aiter_short()}-${archs_key(GPU_ARCHS)}" : trimsuffix(name, "-cpu") != name ? "${name}-vllm${track_build_args.VLLM_VERSION}" : "${name}-vllm${track_build_args.VLLM_VERSION}-${built_on()}-${archs_key(GPU_ARCHS)}"
}

// GPU_ARCHS as a tag component: gfx942;gfx950 (or gfx942,gfx950) -> gfx942-gfx950.
function "archs_key" {
  params = [archs]
  result = length(compact(split(";", replace(archs, ",", ";")))) > 0 ? join("-", compact(split(";", replace(archs, ",", ";")))) : no_value().GPU_ARCHS_is_empty_set_it_eg_gfx942
}

// A target's build cache: extra (CACHE_FROM or CACHE_TO), then with CACHE_REPO <CACHE_REPO>:<cache_key><mode>.
function "cache_refs" {
  params = [extra, name, mode]
  result = compact([extra, CACHE_REPO == "" ? "" : "type=registry,ref=${CACHE_REPO}:${cache_key(name)}${mode}"])
}

group "default" { targets = ["base"] }
group "all" { targets = ["base", "vllm", "serve", "ci"] }
// Checks that build nothing; `docker buildx bake --print validate` must resolve.
group "validate" { targets = ["base-aiter-src"] }

target "_common" {
  context = "."
  args = {
    SOURCE_DATE_EPOCH = track_build_args.SOURCE_DATE_EPOCH
    ALLOW_UNRESOLVED  = ALLOW_UNRESOLVED
    GPU_ARCHS         = GPU_ARCHS
    VCS_REF           = VCS_REF
  }
  secret     = ["id=ca-bundle,src=${CA_BUNDLE}"]
  attest     = ATTEST == "1" ? ["type=sbom", "type=provenance,mode=max"] : []
  // Reproducible layers: file timestamps clamped to SOURCE_DATE_EPOCH.
  output = [PUSH == "1" ? "type=image,rewrite-timestamp=true,push=true" : "type=image,rewrite-timestamp=true"]
  labels = {
    "org.opencontainers.image.source" = "rocm-vllm"
    "org.opencontainers.image.revision" = VCS_REF
  }
}

// One build arg per pin, as docker-bake.pins.json renders them (python3 -m tools.pins args prints the same).
target "_versions" {
  args = merge(pin_build_args, { GPU_ARCHS = GPU_ARCHS })
}

// The build args of Dockerfile.rocm's targets on an existing vLLM image (VLLM_IMAGE, the CPU path):
// the release track and its vLLM release, which the image must hold; no pin of the base or AITER.
target "_embed" {
  args = {
    VLLM_TRACK   = TRACK
    VLLM_VERSION = track_build_args.VLLM_VERSION
  }
}

target "base" {
  inherits   = ["_common", "_versions", pins_check("base", unresolved("base"))]
  dockerfile = "Dockerfile.rocm_base"
  target     = "final"
  args = {
    MAX_JOBS              = MAX_JOBS
    AITER_MEM_PER_JOB_GIB = AITER_MEM_PER_JOB_GIB
    PYPI_INDEX_URL        = PYPI_INDEX_URL
  }
  tags       = image_tags("base")
  cache-from = cache_refs(CACHE_FROM, "base", "")
  cache-to   = cache_refs(CACHE_TO, "base", ",mode=max")
}

// The verified AITER source alone (no ROCm, no compile): quick pin check on any builder.
target "base-aiter-src" {
  inherits   = ["_common", "_versions", pins_check("base-aiter-src", unresolved("base-aiter-src"))]
  dockerfile = "Dockerfile.rocm_base"
  target     = "aiter-verified"
  output     = ["type=cacheonly"]
  cache-from = compact([CACHE_FROM])
  cache-to   = compact([CACHE_TO])
}

// Dockerfile.rocm's settings, shared by its targets (each names its own tags and cache).
target "_dockerfile_rocm" {
  inherits   = ["_common"]
  dockerfile = "Dockerfile.rocm"
  args       = { AITER_CALLS_CHECK = AITER_CALLS_CHECK }
}

// vLLM built here, on the base target, with every pin as a build arg.
target "_vllm_built" {
  inherits = ["_versions"]
  contexts = { base = "target:base" }
}

// The backend embedded into VLLM_IMAGE: `base` is the image too (the stages reading it are not
// built), so the graph holds no base target and the args no pin of the base or AITER.
target "_vllm_image" {
  inherits = ["_embed"]
  contexts = { base = "docker-image://${VLLM_IMAGE}" }
}

// The ROCm targets: vLLM built here, or with VLLM_IMAGE set the existing image.
target "_rocm" {
  inherits   = ["_dockerfile_rocm", VLLM_IMAGE != "" ? "_vllm_image" : "_vllm_built"]
  args       = { VLLM_IMAGE = VLLM_IMAGE }
}

// Dockerfile.rocm's stages: vllm (vLLM built for ROCm on the base image), serve (OpenAI-compatible
// server: vLLM + the AITER MLA backend) and ci (serve + pytest and the self-test suites).
target "rocm_stage" {
  name       = stage
  matrix     = { stage = ["vllm", "serve", "ci"] }
  inherits   = ["_rocm", pins_check(stage, VLLM_IMAGE != "" ? [] : unresolved("vllm"))]
  target     = stage
  tags       = image_tags(stage)
  cache-from = cache_refs(CACHE_FROM, stage, "")
  cache-to   = cache_refs(CACHE_TO, stage, ",mode=max")
}

// ---------------------------------------------------------------- CPU path (no AMD GPU)
// serve and ci on a CPU build of the track's vLLM, in the backend's CPU development mode
// (compose.cpu.yaml); for a laptop or a CI machine, never for production:
//
//   TRACK=0.32 docker buildx bake -f docker-bake.hcl -f docker-bake.pins.json serve-cpu
//   RENDER_GID=0 docker compose -f compose.yaml -f compose.cpu.yaml up -d --wait
//
// The CPU vLLM image must hold the track's vLLM release (else the build stops). Default: vLLM's CPU
// release image on Docker Hub (x86_64, arm64), by tag; another (by digest, local): VLLM_CPU_IMAGE.
variable "VLLM_CPU_IMAGE" { default = "docker.io/vllm/vllm-openai-cpu:v${track_build_args.VLLM_VERSION}" }

// Tags of a CPU image. Local: <name>:<TAG>-vllm<track> and <name>:<TAG> (what compose.cpu.yaml runs)
// on every track: one CPU path at a time on a machine. Pushed: <name>:vllm<vLLM version>-cpu-<12 hex
// of VCS_REF>, and the floating TAG as for the ROCm images.
function "cpu_tags" {
  params = [name]
  result = PUSH == "1" ? pushed_tags("${REGISTRY}/${name}", "cpu") : ["${REGISTRY}/${name}:${TAG}-vllm${TRACK}", "${REGISTRY}/${name}:${TAG}"]
}

// Dockerfile.rocm's existing-image path on the CPU vLLM image, which is the named context `base`
// too (the stages reading it are not built here; the ROCm base target never is): the serve and ci
// targets with VLLM_IMAGE set to the CPU image. They build from no ROCm pin, so no pins check.
// PUSH=0: no registry cache, no attestations (no release). PUSH=1: pushed like the ROCm images, with
// registry cache and, ATTEST=1, attestations. Pushed output has no rewrite-timestamp: the engine's
// builder with the containerd image store refuses it; the CPU layers are reproducible without it.
target "_cpu" {
  contexts = { base = "docker-image://${VLLM_CPU_IMAGE}" }
  args     = { VLLM_IMAGE = VLLM_CPU_IMAGE }
  output   = [PUSH == "1" ? "type=image,push=true" : "type=image,rewrite-timestamp=true"]
  attest   = PUSH == "1" && ATTEST == "1" ? ["type=sbom", "type=provenance,mode=max"] : ["type=sbom,disabled=true", "type=provenance,disabled=true"]
}

// serve-cpu and ci-cpu: the serve and ci stages.
target "cpu_stage" {
  name       = "${stage}-cpu"
  matrix     = { stage = ["serve", "ci"] }
  inherits   = ["_dockerfile_rocm", "_embed", "_cpu"]
  target     = stage
  tags       = cpu_tags("${stage}-cpu")
  cache-from = cache_refs(CACHE_FROM, "${stage}-cpu", "")
  cache-to   = PUSH == "1" ? cache_refs(CACHE_TO, "${stage}-cpu", ",mode=max") : compact([CACHE_TO])
}

group "cpu" { targets = ["serve-cpu", "ci-cpu"] }
