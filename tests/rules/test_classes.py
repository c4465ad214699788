from hooks.rules.classes import ClassIdentity, older_class_with_resource
from tests.builders import GPU, OTHER_GPU


def cls(
    name: str,
    created: str | None = "2026-01-02T00:00:00Z",
    *,
    resource: str | None = GPU,
    deleting: bool = False,
) -> ClassIdentity:
    return ClassIdentity(name=name, created=created, deleting=deleting, resource_name=resource)


def test_conflict_older_class_by_creation_timestamp_wins() -> None:
    parent = cls("new", "2026-03-01T00:00:00Z")
    older = cls("old", "2026-01-01T00:00:00Z")
    assert older_class_with_resource(parent, [parent, older]) == older
    assert older_class_with_resource(older, [parent, older]) is None


def test_conflict_same_timestamp_is_decided_by_name() -> None:
    a, b = cls("a"), cls("b")
    assert older_class_with_resource(b, [a, b]) == a
    assert older_class_with_resource(a, [a, b]) is None


def test_conflict_ignores_classes_being_deleted() -> None:
    parent = cls("new", "2026-03-01T00:00:00Z")
    assert (
        older_class_with_resource(parent, [cls("old", "2026-01-01T00:00:00Z", deleting=True)])
        is None
    )


def test_conflict_needs_the_same_resource_name() -> None:
    assert older_class_with_resource(cls("b"), [cls("a", resource=OTHER_GPU)]) is None


def test_conflict_names_the_oldest_of_several() -> None:
    parent = cls("z", "2026-05-01T00:00:00Z")
    rivals = [cls("m", "2026-03-01T00:00:00Z"), cls("k", "2026-02-01T00:00:00Z")]
    assert older_class_with_resource(parent, rivals) == rivals[1]


def test_class_without_creation_timestamp_is_the_youngest() -> None:
    assert older_class_with_resource(cls("a", None), [cls("b")]) == cls("b")
    assert older_class_with_resource(cls("b"), [cls("a", None)]) is None


def test_invalid_spec_competes_for_nothing() -> None:
    assert older_class_with_resource(cls("b"), [cls("a", resource=None)]) is None
    assert older_class_with_resource(cls("b", resource=None), [cls("a", resource=None)]) is None


def test_class_identity_carries_age_and_deletion() -> None:
    from hooks.rules.classes import class_identity
    from hooks.wire.kube import GPUClass
    from tests.builders import as_wire, gpuclass

    going = gpuclass("a", created="2026-01-01T00:00:00Z")
    going["metadata"]["deletionTimestamp"] = "2026-02-01T00:00:00Z"
    identity = class_identity(as_wire(going, GPUClass))
    assert (identity.created, identity.deleting) == ("2026-01-01T00:00:00Z", True)
    assert class_identity(as_wire(gpuclass("b"), GPUClass)).deleting is False


def test_class_with_an_empty_creation_timestamp_is_the_youngest() -> None:
    """An empty timestamp says no more than a missing one: it must not make a class the oldest
    and take a resource from a real one."""
    assert older_class_with_resource(cls("a", ""), [cls("b")]) == cls("b")
    assert older_class_with_resource(cls("b"), [cls("a", "")]) is None
