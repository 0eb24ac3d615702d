"""The container image at plan time (issue 26): enroot's reference form, and the image's Ray
against what hpcrl runs on and what ``ray_auth: token`` needs, known from the profile's
``ray_version`` or a NeMo RL release tag, so a profile that contradicts itself is refused
before the queue wait instead of by every node after it."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config import load_profile
from hpcrl.config.errors import ConfigError
from hpcrl.plan.images import enroot_form_of
from hpcrl.plan.planner import plan
from tests.plan.planning_inputs import GOLDEN_RUN_DIR, pyxis_profile
from tests.recipe_builder import megatron_recipe


def plan_errors(profile) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        plan(megatron_recipe(), profile, run_dir=GOLDEN_RUN_DIR, recipe_source="r")
    return [problem.format() for problem in caught.value.errors]


def with_image(image: str, **changes: object):
    profile = pyxis_profile(**changes)
    return attrs.evolve(profile, container=attrs.evolve(profile.container, image=image))


@pytest.mark.parametrize(
    ("image", "enroot"),
    [
        ("nvcr.io/nvidia/nemo-rl:v0.7.0", "nvcr.io#nvidia/nemo-rl:v0.7.0"),
        ("docker://nvcr.io/nvidia/nemo-rl:v0.7.0", "nvcr.io#nvidia/nemo-rl:v0.7.0"),
        ("me@nvcr.io/nvidia/nemo-rl:v0.7.0", "me@nvcr.io#nvidia/nemo-rl:v0.7.0"),
        ("localhost:5000/team/img", "localhost:5000#team/img"),
        ("nvcr.io#nvidia/nemo-rl:v0.7.0", "nvcr.io#nvidia/nemo-rl:v0.7.0"),
        ("ubuntu:22.04", "ubuntu:22.04"),
        ("nvidia/cuda:12.4.0-base", "nvidia/cuda:12.4.0-base"),
        ("/lustre/images/nemo-rl.sqsh", "/lustre/images/nemo-rl.sqsh"),
        ("./nemo-rl.sqsh", "./nemo-rl.sqsh"),
        ("s3://bucket/image", None),
    ],
)
def test_enroot_form(image, enroot):
    assert enroot_form_of(image) == enroot


def test_a_docker_style_reference_is_refused_naming_the_enroot_form():
    assert plan_errors(with_image("nvcr.io/nvidia/nemo-rl:v0.7.0")) == [
        "error: profile[site].container.image = 'nvcr.io/nvidia/nemo-rl:v0.7.0': written in "
        "Docker's form: pyxis hands it to enroot, which separates the registry with '#' and "
        "would look for this image on Docker Hub, so every node would fail to pull it after the "
        "queue wait\n  fix: write it in enroot's form: container.image: "
        "nvcr.io#nvidia/nemo-rl:v0.7.0"
    ]


def test_an_image_whose_ray_lacks_token_authentication_is_refused_with_token_auth():
    assert plan_errors(with_image("nvcr.io#nvidia/nemo-rl:v0.5.0")) == [
        "error: profile[site].ray_auth = 'token': token authentication needs ray>=2.52, and the "
        "job's Ray would be 2.49.2 (NeMo RL v0.5.0's pin, in its image): every node would "
        "refuse the job after the queue wait\n  fix: use an image with ray>=2.52, e.g. "
        "container.image: nvcr.io#nvidia/nemo-rl:v0.7.0 (Ray 2.55.1), or set ray_auth: none "
        "(anyone who reaches the job's ports can then run code as you)"
    ]
    spec = plan(megatron_recipe(), with_image("nvcr.io#nvidia/nemo-rl:v0.5.0", ray_auth="none"),
                run_dir=GOLDEN_RUN_DIR, recipe_source="r")  # fmt: skip
    assert [warning.path for warning in spec.warnings] == ["profile[site].ray_auth"]


def test_an_image_whose_ray_hpcrl_does_not_run_on_is_refused_once():
    assert plan_errors(with_image("nvcr.io#nvidia/nemo-rl:v0.4.0")) == [
        "error: profile[site].container.image = 'nvcr.io#nvidia/nemo-rl:v0.4.0': the job's Ray "
        "would be 2.46.0 (NeMo RL v0.4.0's pin, in its image), and hpcrl's job side runs on "
        "ray>=2.49,<2.61: every node's preflight would refuse it after the queue wait\n"
        "  fix: use an image with ray>=2.49,<2.61, e.g. container.image: "
        "nvcr.io#nvidia/nemo-rl:v0.7.0 (Ray 2.55.1)"
    ]


def test_the_profiles_ray_version_wins_over_the_tag_and_is_named():
    spec = plan(megatron_recipe(), with_image("nvcr.io#nvidia/nemo-rl:v0.5.0", ray_version="2.55.0"),
                run_dir=GOLDEN_RUN_DIR, recipe_source="r")  # fmt: skip
    (check,) = [check for check in spec.checks if check.name == "ray_auth"]
    assert check.message.endswith(
        "it needs ray>=2.52: the job's Ray is 2.55.0 (the profile's ray_version)"
    )
    assert plan_errors(with_image("/images/mine.sqsh", ray_version="2.50.1"))[0].startswith(
        "error: profile[site].ray_auth = 'token': token authentication needs ray>=2.52, and the "
        "job's Ray would be 2.50.1 (the profile's ray_version)"
    )
    assert plan_errors(with_image("/images/mine.sqsh", ray_version="latest")) == [
        "error: profile[site].ray_version = 'latest': not a Ray release number\n"
        '  fix: write the release the image has, e.g. ray_version: "2.55.1" (python3 -c "import '
        'ray; print(ray.__version__)" inside the image), or remove it'
    ]


def test_an_unknown_image_is_left_to_the_preflight():
    spec = plan(megatron_recipe(), with_image("/images/mine.sqsh"), run_dir=GOLDEN_RUN_DIR,
                recipe_source="r")  # fmt: skip
    (check,) = [check for check in spec.checks if check.name == "ray_auth"]
    assert check.message.endswith("it needs ray>=2.52: each node checks that before Ray starts")


def test_the_shipped_eos_profile_does_not_contradict_itself():
    profile = load_profile("eos")
    assert profile.container.image == "nvcr.io#nvidia/nemo-rl:v0.7.0"
    assert profile.ray_auth == "token"
    spec = plan(megatron_recipe(), attrs.evolve(profile, env={}), run_dir=GOLDEN_RUN_DIR,
                recipe_source="r")  # fmt: skip
    (check,) = [check for check in spec.checks if check.name == "ray_auth"]
    assert check.status == "passed"
    assert "the job's Ray is 2.55.1 (NeMo RL v0.7.0's pin, in its image)" in check.message
