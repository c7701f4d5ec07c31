// Build graph of the images. Pins come from versions.json, passed as a second file:
//
//   docker buildx bake -f docker-bake.hcl -f versions.json base      # the base image
//   TRACK=0.32 docker buildx bake -f docker-bake.hcl -f versions.json serve  # another release track
//   docker buildx bake -f docker-bake.hcl -f versions.json validate  # print-only check targets
//
// Images for a registry (what CI runs; --print shows the tags, cache refs and attestations):
//
//   PUSH=1 REGISTRY=ghcr.io/org/rocm-vllm TAG=main VCS_REF=$(git rev-parse HEAD) \
//     docker buildx bake -f docker-bake.hcl -f versions.json base serve ci
//
// versions.json's top-level keys (tracks, aiter, vllm, base_image, gpu_archs, ...) become bake
// variables; without it every target fails with "There is no variable named ...".
// Settings below can be overridden from the environment, e.g. GPU_ARCHS=gfx942.

variable "REGISTRY" { default = "localhost/rocm-vllm" }
variable "TAG" { default = "dev" }
// Release track to build: a key of tracks in versions.json (default: default_track, the newest).
variable "TRACK" { default = default_track }
// TRACK when versions.json has it; else bake stops in one line naming it and the known tracks
// (base64decode's error carries the text: no string with a space is base64).
function "known_track" {
  params = []
  result = contains(keys(tracks), TRACK) ? TRACK : base64decode("TRACK=${TRACK} is no release track of versions.json; the tracks: ${join(", ", sort(keys(tracks)))}")
}
// AITER pin to build: a key of aiter.pins in versions.json (default: the track's).
variable "AITER_PIN" { default = tracks[known_track()].aiter }
// GPU archs to build kernels for, ';'-separated; default from versions.json gpu_archs.
variable "GPU_ARCHS" { default = join(";", gpu_archs) }
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

// name:tag@digest of the base image; an unresolved field is UNRESOLVED (pins_check names it).
function "rocm_image" {
  params = [image, allow]
  result = "${coalesce(image.name, "UNRESOLVED")}:${coalesce(image.tag, "UNRESOLVED")}${image.digest != null ? "@${image.digest}" : (allow == "1" ? "" : "@sha256:UNRESOLVED")}"
}

// A shared section (rocm, base_image, pytorch) as the track sees it: its own, else the shared one.
function "track_section" {
  params = [name, shared]
  result = lookup(tracks[known_track()], name, shared)
}

// Tags of a target. Local (PUSH=0): <name>:<TAG>-vllm<track>, and <name>:<TAG> for the default
// track. Pushed (PUSH=1): <name>:<commit_tag>, and the floating TAG (a branch or git tag name) when
// set: <name>:<TAG> for the default track, <name>:<TAG>-vllm<track> for another.
function "image_tags" {
  params = [name]
  result = PUSH == "1" ? pushed_tags("${REGISTRY}/${name}") : concat(
    ["${REGISTRY}/${name}:${TAG}-vllm${TRACK}"],
    TRACK == default_track ? ["${REGISTRY}/${name}:${TAG}"] : [])
}

function "pushed_tags" {
  params = [image]
  result = distinct(concat(
    ["${image}:${commit_tag(VCS_REF)}"],
    TAG == "" ? [] : [TRACK == default_track ? "${image}:${TAG}" : "${image}:${TAG}-vllm${TRACK}"]))
}

// The 12 hex of the AITER commit the build compiles (UNRESOLVED while the pin has none).
function "aiter_short" {
  params = []
  result = substr(coalesce(aiter.pins[AITER_PIN].commit, "UNRESOLVED"), 0, 12)
}

// What a vLLM target is built on, in its tags and cache keys: aiter<12 hex of the AITER commit>, or
// with VLLM_IMAGE image<12 hex of the sha256 of its reference> (the image's AITER is not this build's).
function "built_on" {
  params = []
  result = VLLM_IMAGE != "" ? "image${substr(sha256(VLLM_IMAGE), 0, 12)}" : "aiter${aiter_short()}"
}

// Tag of a pushed build: what it holds (the track's vLLM version, the AITER commit or the vLLM image:
// built_on) and the commit it was built from. A revision that is not a full commit id stops bake, naming VCS_REF.
function "commit_tag" {
  params = [revision]
  result = length(regexall("^[0-9a-f]{40}$", revision)) == 1 ? "vllm${tracks[known_track()].vllm.version}-${built_on()}-${substr(revision, 0, 12)}" : no_value().VCS_REF_must_be_the_full_40_hex_commit_id_with_PUSH_1
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
  result = length(pins) == 0 || ALLOW_UNRESOLVED == "1" ? "_pins_resolved" : "${name} (track ${TRACK}): it builds from ${length(pins)} unresolved pin(s) of versions.json: ${join(", ", pins)}: run python3 -m ci.pins resolve --write on a machine that reaches GitHub, PyPI, the container registry and ${stack() == "therock" ? "TheRock's wheel index" : "the PyTorch wheel index"}, or set ALLOW_UNRESOLVED=1 for a development image"
}

// The track's ROCm stack: rocm-image or therock, the stages Dockerfile.rocm_base's ROCM_STACK picks.
function "stack" {
  params = []
  result = lookup(tracks[known_track()], "stack", "rocm-image")
}

// versions.json paths (path.key) of the keys of node that are null.
function "nulls" {
  params = [path, node, keys]
  result = [for key, value in node : "${path}.${key}" if value == null && contains(keys, key)]
}

// Where versions.json holds a shared section (rocm, base_image, pytorch) for the track.
function "section_path" {
  params = [name]
  result = contains(keys(tracks[known_track()]), name) ? "tracks.${TRACK}.${name}" : name
}

// The pins the verified AITER source (base-aiter-src) builds from.
function "aiter_source_pins" {
  params = []
  result = concat(
    nulls(section_path("base_image"), track_section("base_image", base_image), ["name", "tag", "digest"]),
    nulls("aiter", aiter, ["repository", "ck_submodule_path"]),
    nulls("aiter.pins.${AITER_PIN}", aiter.pins[AITER_PIN], ["tag", "commit", "ck_commit"]))
}

// The pins the base image builds from: the AITER source's, HipKittens, AITER's requirements lock,
// and the stack's PyTorch lock (rocm-image) or TheRock lock and Triton source (therock). An unresolved
// TheRock lock stops even with ALLOW_UNRESOLVED=1 (never installed unhashed): the build step names it.
function "base_pins" {
  params = []
  result = concat(
    aiter_source_pins(),
    nulls("aiter", aiter, ["hipkittens_repository", "required_modules"]),
    nulls("aiter.pins.${AITER_PIN}", aiter.pins[AITER_PIN], ["hipkittens_commit", "requirements_lock_sha256"]),
    stack() == "therock" ? therock_pins() : pytorch_pins())
}

function "pytorch_pins" {
  params = []
  result = nulls(section_path("pytorch"), track_section("pytorch", pytorch), ["index_url", "lock_sha256"])
}

// The track's PyTorch lock in ci/locks/, named after its pytorch section (model.py pytorch_lock_name).
function "pytorch_lock" {
  params = []
  result = contains(keys(tracks[known_track()]), "pytorch") ? "pytorch-${TRACK}.txt" : "pytorch.txt"
}

function "therock_pins" {
  params = []
  result = concat(
    nulls("tracks.${TRACK}.therock", tracks[known_track()].therock, ["index_url", "lock_sha256"]),
    nulls("tracks.${TRACK}.therock.triton", tracks[known_track()].therock.triton, ["repository", "commit", "version"]))
}

// The pins of Dockerfile.rocm's targets: the base image's (bake builds target:base for them) and the
// track's vLLM source when vLLM is built here; none on an existing vLLM image (VLLM_IMAGE set).
function "vllm_pins" {
  params = []
  result = VLLM_IMAGE != "" ? [] : concat(base_pins(),
    nulls("vllm", vllm, ["repository"]),
    nulls("vllm.triton_kernels", vllm.triton_kernels, ["repository", "path"]),
    nulls("tracks.${TRACK}.vllm", tracks[known_track()].vllm, ["tag", "commit", "triton_kernels_commit"]))
}

// Build cache key of a target, from what its layers depend on: the base's has no vLLM version (a
// vLLM bump keeps the AITER layers' cache); vLLM targets' add it (a track has one stack).
function "cache_key" {
  params = [name]
  result = name == "base" ? "base-${stack()}-aiter${aiter_short()}-${archs_key(GPU_ARCHS)}" : "${name}-vllm${tracks[known_track()].vllm.version}-${built_on()}-${archs_key(GPU_ARCHS)}"
}

// GPU_ARCHS as a tag component: gfx942;gfx950 (or gfx942,gfx950) -> gfx942-gfx950.
function "archs_key" {
  params = [archs]
  result = length(compact(split(";", replace(archs, ",", ";")))) > 0 ? join("-", compact(split(";", replace(archs, ",", ";")))) : no_value().GPU_ARCHS_is_empty_set_it_eg_gfx942
}

function "cache_from" {
  params = [name]
  result = concat(CACHE_FROM == "" ? [] : [CACHE_FROM], CACHE_REPO == "" ? [] : ["type=registry,ref=${CACHE_REPO}:${cache_key(name)}"])
}

function "cache_to" {
  params = [name]
  result = concat(CACHE_TO == "" ? [] : [CACHE_TO], CACHE_REPO == "" ? [] : ["type=registry,ref=${CACHE_REPO}:${cache_key(name)},mode=max"])
}

group "default" { targets = ["base"] }
group "all" { targets = ["base", "vllm", "serve", "ci"] }
// Checks that build nothing; `docker buildx bake --print validate` must resolve.
group "validate" { targets = ["base-aiter-src"] }

target "_common" {
  context = "."
  args = {
    SOURCE_DATE_EPOCH = source_date_epoch
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

// One build arg per pin, as python3 -m ci.pins args prints them: null is UNRESOLVED, the other stack's "".
target "_versions" {
  args = {
    VLLM_TRACK     = TRACK
    VLLM_VERSION   = tracks[known_track()].vllm.version
    ROCM_STACK     = stack()
    ROCM_IMAGE     = rocm_image(track_section("base_image", base_image), ALLOW_UNRESOLVED)
    ROCM_VERSION   = track_section("rocm", rocm).version
    PYTHON_VERSION = python.version
    // aiter's shared fields and the track's pin (AITER_PIN); its requirements' hash lock in ci/locks/
    AITER_REPOSITORY               = coalesce(aiter.repository, "UNRESOLVED")
    AITER_TAG                      = coalesce(aiter.pins[AITER_PIN].tag, "UNRESOLVED")
    AITER_COMMIT                   = coalesce(aiter.pins[AITER_PIN].commit, "UNRESOLVED")
    CK_COMMIT                      = coalesce(aiter.pins[AITER_PIN].ck_commit, "UNRESOLVED")
    CK_SUBMODULE_PATH              = coalesce(aiter.ck_submodule_path, "UNRESOLVED")
    HIPKITTENS_REPOSITORY          = coalesce(aiter.hipkittens_repository, "UNRESOLVED")
    HIPKITTENS_COMMIT              = coalesce(aiter.pins[AITER_PIN].hipkittens_commit, "UNRESOLVED")
    AITER_REQUIRED_MODULES         = aiter.required_modules == null ? "UNRESOLVED" : join(" ", aiter.required_modules)
    AITER_REQUIREMENTS_LOCK        = "aiter-${aiter.pins[AITER_PIN].tag}.txt"
    AITER_REQUIREMENTS_LOCK_SHA256 = coalesce(aiter.pins[AITER_PIN].requirements_lock_sha256, "UNRESOLVED")
    // the track's pytorch section and its lock (rocm-image; "" on therock: PyTorch is in the TheRock lock)
    PYTORCH_INDEX_URL   = stack() == "therock" ? "" : coalesce(track_section("pytorch", pytorch).index_url, "UNRESOLVED")
    PYTORCH_LOCK        = stack() == "therock" ? "" : pytorch_lock()
    PYTORCH_LOCK_SHA256 = stack() == "therock" ? "" : coalesce(track_section("pytorch", pytorch).lock_sha256, "UNRESOLVED")
    TORCH_VERSION       = stack() == "therock" ? "" : coalesce(track_section("pytorch", pytorch).torch.torch, "UNRESOLVED")
    TORCHVISION_VERSION = stack() == "therock" ? "" : coalesce(track_section("pytorch", pytorch).torch.torchvision, "UNRESOLVED")
    TORCHAUDIO_VERSION  = stack() == "therock" ? "" : coalesce(track_section("pytorch", pytorch).torch.torchaudio, "UNRESOLVED")
    // a therock track's TheRock section, its lock and the Triton source ("" on rocm-image)
    THEROCK_INDEX_URL   = stack() != "therock" ? "" : coalesce(tracks[known_track()].therock.index_url, "UNRESOLVED")
    THEROCK_LOCK        = stack() != "therock" ? "" : "therock-${TRACK}.txt"
    THEROCK_LOCK_SHA256 = stack() != "therock" ? "" : coalesce(tracks[known_track()].therock.lock_sha256, "UNRESOLVED")
    TRITON_REPOSITORY   = stack() != "therock" ? "" : coalesce(tracks[known_track()].therock.triton.repository, "UNRESOLVED")
    TRITON_COMMIT       = stack() != "therock" ? "" : coalesce(tracks[known_track()].therock.triton.commit, "UNRESOLVED")
    TRITON_VERSION      = stack() != "therock" ? "" : coalesce(tracks[known_track()].therock.triton.version, "UNRESOLVED")
    // vllm's shared repository and triton_kernels, and the track's release
    VLLM_REPOSITORY           = coalesce(vllm.repository, "UNRESOLVED")
    VLLM_TAG                  = coalesce(tracks[known_track()].vllm.tag, "UNRESOLVED")
    VLLM_COMMIT               = coalesce(tracks[known_track()].vllm.commit, "UNRESOLVED")
    TRITON_KERNELS_REPOSITORY = coalesce(vllm.triton_kernels.repository, "UNRESOLVED")
    TRITON_KERNELS_COMMIT     = coalesce(tracks[known_track()].vllm.triton_kernels_commit, "UNRESOLVED")
    TRITON_KERNELS_PATH       = coalesce(vllm.triton_kernels.path, "UNRESOLVED")
  }
}

// The build args of Dockerfile.rocm's targets on an existing vLLM image (VLLM_IMAGE, the CPU path):
// the release track and its vLLM release, which the image must hold; no pin of the base or AITER.
target "_embed" {
  args = {
    VLLM_TRACK   = TRACK
    VLLM_VERSION = tracks[known_track()].vllm.version
  }
}

target "base" {
  inherits   = ["_common", "_versions", pins_check("base", base_pins())]
  dockerfile = "Dockerfile.rocm_base"
  target     = "final"
  args = {
    MAX_JOBS              = MAX_JOBS
    AITER_MEM_PER_JOB_GIB = AITER_MEM_PER_JOB_GIB
    PYPI_INDEX_URL        = PYPI_INDEX_URL
  }
  tags       = image_tags("base")
  cache-from = cache_from("base")
  cache-to   = cache_to("base")
}

// The verified AITER source alone (no ROCm, no compile): quick pin check on any builder.
target "base-aiter-src" {
  inherits   = ["_common", "_versions", pins_check("base-aiter-src", aiter_source_pins())]
  dockerfile = "Dockerfile.rocm_base"
  target     = "aiter-verified"
  output     = ["type=cacheonly"]
  cache-from = CACHE_FROM == "" ? [] : [CACHE_FROM]
  cache-to   = CACHE_TO == "" ? [] : [CACHE_TO]
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

// vLLM built for ROCm on the base image (Dockerfile.rocm, stage vllm).
target "vllm" {
  inherits   = ["_rocm", pins_check("vllm", vllm_pins())]
  target     = "vllm"
  tags       = image_tags("vllm")
  cache-from = cache_from("vllm")
  cache-to   = cache_to("vllm")
}

// OpenAI-compatible server: vLLM + the AITER MLA backend (Dockerfile.rocm, stage serve).
target "serve" {
  inherits   = ["_rocm", pins_check("serve", vllm_pins())]
  target     = "serve"
  tags       = image_tags("serve")
  cache-from = cache_from("serve")
  cache-to   = cache_to("serve")
}

// serve + pytest and the self-test suites (Dockerfile.rocm, stage ci).
target "ci" {
  inherits   = ["_rocm", pins_check("ci", vllm_pins())]
  target     = "ci"
  tags       = image_tags("ci")
  cache-from = cache_from("ci")
  cache-to   = cache_to("ci")
}

// ---------------------------------------------------------------- CPU path (no AMD GPU)
// serve and ci on a CPU build of the track's vLLM, in the backend's CPU development mode
// (compose.cpu.yaml); for a laptop or a CI machine, never for production:
//
//   TRACK=0.32 docker buildx bake -f docker-bake.hcl -f versions.json serve-cpu
//   RENDER_GID=0 docker compose -f compose.yaml -f compose.cpu.yaml up -d --wait
//
// The CPU vLLM image must hold the track's vLLM release (else the build stops). Default: vLLM's CPU
// release image on Docker Hub (x86_64, arm64), by tag; another (by digest, local): VLLM_CPU_IMAGE.
variable "VLLM_CPU_IMAGE" { default = "docker.io/vllm/vllm-openai-cpu:v${tracks[known_track()].vllm.version}" }

// Tags of a CPU image. Local: <name>:<TAG>-vllm<track> and <name>:<TAG> (what compose.cpu.yaml runs)
// on every track: one CPU path at a time on a machine. Pushed: <name>:vllm<vLLM version>-cpu-<12 hex
// of VCS_REF>, and the floating TAG as for the ROCm images.
function "cpu_tags" {
  params = [name]
  result = PUSH == "1" ? distinct(concat(
    ["${REGISTRY}/${name}:${cpu_commit_tag(VCS_REF)}"],
    TAG == "" ? [] : [TRACK == default_track ? "${REGISTRY}/${name}:${TAG}" : "${REGISTRY}/${name}:${TAG}-vllm${TRACK}"]
  )) : ["${REGISTRY}/${name}:${TAG}-vllm${TRACK}", "${REGISTRY}/${name}:${TAG}"]
}

function "cpu_commit_tag" {
  params = [revision]
  result = length(regexall("^[0-9a-f]{40}$", revision)) == 1 ? "vllm${tracks[known_track()].vllm.version}-cpu-${substr(revision, 0, 12)}" : no_value().VCS_REF_must_be_the_full_40_hex_commit_id_with_PUSH_1
}

// Registry build cache of a CPU image: <CACHE_REPO>:<name>-vllm<vLLM version> (no AITER, no GPU archs).
function "cpu_cache_from" {
  params = [name]
  result = concat(CACHE_FROM == "" ? [] : [CACHE_FROM], CACHE_REPO == "" ? [] : ["type=registry,ref=${CACHE_REPO}:${name}-vllm${tracks[known_track()].vllm.version}"])
}

function "cpu_cache_to" {
  params = [name]
  result = concat(CACHE_TO == "" ? [] : [CACHE_TO], CACHE_REPO == "" ? [] : ["type=registry,ref=${CACHE_REPO}:${name}-vllm${tracks[known_track()].vllm.version},mode=max"])
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

target "serve-cpu" {
  inherits   = ["_dockerfile_rocm", "_embed", "_cpu"]
  target     = "serve"
  tags       = cpu_tags("serve-cpu")
  cache-from = cpu_cache_from("serve-cpu")
  cache-to   = PUSH == "1" ? cpu_cache_to("serve-cpu") : (CACHE_TO == "" ? [] : [CACHE_TO])
}

target "ci-cpu" {
  inherits   = ["_dockerfile_rocm", "_embed", "_cpu"]
  target     = "ci"
  tags       = cpu_tags("ci-cpu")
  cache-from = cpu_cache_from("ci-cpu")
  cache-to   = PUSH == "1" ? cpu_cache_to("ci-cpu") : (CACHE_TO == "" ? [] : [CACHE_TO])
}

group "cpu" { targets = ["serve-cpu", "ci-cpu"] }
