"""The container image as pyxis takes it, and the Ray it brings, known before the queue wait.

pyxis hands ``--container-image`` to enroot, whose form is ``[USER@][REGISTRY#]IMAGE[:TAG]``
(or the path of a squashfs file): the registry is separated by ``#``. A Docker-style
``nvcr.io/nvidia/nemo-rl:v0.7.0`` reads to enroot as the Docker Hub image
``nvcr.io/nvidia/nemo-rl``, so every node fails to pull it once the job has waited in the
queue; the plan refuses it and names the enroot form.

The image's Ray decides whether the job can run at all (hpcrl's job side supports a range of
Ray releases) and whether ``ray_auth: token`` can (Ray token authentication needs 2.52).
It is known from the profile's ``ray_version`` (what the site says its image has; it wins),
else from the tag of a NeMo RL release image, whose Ray is NeMo RL's own pin
(``NEMO_RL_IMAGE_RAY``). Any other image is checked by every node's preflight when the job
starts.
"""

from __future__ import annotations

import re

import attrs

from hpcrl.config.profile import ClusterProfile
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path

#: NeMo RL's release images on NGC and the Ray each carries: the ``ray[default]`` pin of the
#: release's pyproject.toml, as its uv.lock resolved it (github.com/NVIDIA-NeMo/RL, tags
#: v0.4.0-v0.7.0; v0.4.0 is the first release with an NGC image, per NeMo RL's README).
NEMO_RL_IMAGE_RAY = {
    "nvcr.io#nvidia/nemo-rl:v0.4.0": "2.46.0",
    "nvcr.io#nvidia/nemo-rl:v0.5.0": "2.49.2",
    "nvcr.io#nvidia/nemo-rl:v0.6.0": "2.54.0",
    "nvcr.io#nvidia/nemo-rl:v0.7.0": "2.55.1",
}
_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
#: A first path part that names a registry host: it has a dot or a port, or is localhost.
_REGISTRY_HOST = re.compile(r"[^/]*[.:][^/]*|localhost")


@attrs.frozen
class ImageRay(SharedMethods):
    """The Ray of the job's Python and where that is known from (for messages)."""

    version: str
    source: str


def check_image_reference(profile: ClusterProfile, findings: Findings) -> None:
    """Error for an image pyxis cannot pull as written (``registry/image`` for
    ``registry#image``, or a URL)."""
    if profile.container is None:
        return
    image = profile.container.image.strip()
    enroot_form = enroot_form_of(image)
    if enroot_form is None or enroot_form == image:
        return
    if "://" in image:
        message = "a URL: pyxis takes an image as [USER@][REGISTRY#]IMAGE[:TAG] or a squashfs path"
    else:
        message = (
            "written in Docker's form: pyxis hands it to enroot, which separates the registry "
            "with '#' and would look for this image on Docker Hub, so every node would fail to "
            "pull it after the queue wait"
        )
    findings.error(
        profile_path(profile, "container.image"),
        message,
        value=image,
        fix=f"write it in enroot's form: container.image: {enroot_form}",
    )


def enroot_form_of(image: str) -> str | None:
    """``image`` as enroot takes it (itself when it already is; None when it is not an image
    reference hpcrl can rewrite)."""
    if image.startswith(("/", "./")):
        return image  # a squashfs file
    scheme, separator, rest = image.partition("://")
    if separator:
        return enroot_form_of(rest) if scheme in ("docker", "https", "http") else None
    user, at, reference = image.partition("@") if "@" in image.split("/")[0] else ("", "", image)
    if "#" in reference:
        return image
    host, slash, path = reference.partition("/")
    if slash and _REGISTRY_HOST.fullmatch(host):
        return f"{user}{at}{host}#{path}"
    return image


def image_ray(profile: ClusterProfile) -> ImageRay | None:
    """The Ray the job will find, when the profile says it or its image is a known one."""
    if profile.ray_version is not None:
        return ImageRay(profile.ray_version, "the profile's ray_version")
    if profile.container is None:
        return None
    image = profile.container.image.strip()
    version = NEMO_RL_IMAGE_RAY.get(enroot_form_of(image) or image)
    if version is None:
        return None
    tag = image.rpartition(":")[2]
    return ImageRay(version, f"NeMo RL {tag}'s pin, in its image")


def check_ray_version_text(profile: ClusterProfile, findings: Findings) -> bool:
    """False (with an error) when ``ray_version`` is not a release number."""
    if profile.ray_version is None or _VERSION.fullmatch(profile.ray_version.strip()):
        return True
    findings.error(
        profile_path(profile, "ray_version"),
        "not a Ray release number",
        value=profile.ray_version,
        fix='write the release the image has, e.g. ray_version: "2.55.1" (python3 -c "import '
        'ray; print(ray.__version__)" inside the image), or remove it',
    )
    return False


def check_image_ray(profile: ClusterProfile, findings: Findings) -> ImageRay | None:
    """The job's Ray when known (``image_ray``); None, with an error, when hpcrl's job side
    does not run on it (every node's preflight would refuse it after the queue wait)."""
    if not check_ray_version_text(profile, findings):
        return None
    found = image_ray(profile)
    if found is None:
        return None
    from hpcrl.plan.requirements import SUPPORTED
    from hpcrl.run.versions import in_range  # the preflight's own comparison (pure Python)

    (ray,) = (row for row in SUPPORTED if row.module == "ray")
    if not in_range(found.version, ray.spec):
        findings.error(
            ray_version_path(profile),
            f"the job's Ray would be {found.version} ({found.source}), and hpcrl's job side "
            f"runs on ray{ray.spec}: every node's preflight would refuse it after the queue wait",
            value=found.version if profile.ray_version else profile.container.image,  # type: ignore[union-attr]
            fix=f"use an image with ray{ray.spec}, e.g. container.image: {RECOMMENDED_IMAGE} "
            f"(Ray {NEMO_RL_IMAGE_RAY[RECOMMENDED_IMAGE]})",
        )
        return None  # what else depends on the Ray is moot
    return found


def ray_version_path(profile: ClusterProfile) -> str:
    """Where the job's Ray is said: ``ray_version`` when set, else the image."""
    key = "ray_version" if profile.ray_version is not None else "container.image"
    return profile_path(profile, key)


#: The newest NeMo RL image in the table: the one fixes point to.
RECOMMENDED_IMAGE = "nvcr.io#nvidia/nemo-rl:v0.7.0"
