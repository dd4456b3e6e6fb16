"""muster_rank.sharded.plans on lists: what to restore from whom, how to re-slice, whose buddy is whom."""

import os
import subprocess
import sys
import unittest

from muster_rank.sharded import plans


class Placement:
    def __init__(self, kind, dim=None):
        self.kind, self.dim = kind, dim

    def is_replicate(self):
        return self.kind == "R"

    def is_shard(self):
        return self.kind == "S"


class RestorePlanTest(unittest.TestCase):
    def test_every_rank_its_own(self):
        offers = [[(r, 2, 10), (r, 2, 20)] for r in range(2)]
        self.assertEqual(plans.restore_plan(offers, 2), (20, [0, 1]))

    def test_a_replacement_from_its_buddy(self):
        # rank 1 is new (holds nothing); rank 0 holds its replica of step 20, not of 30
        offers = [[(0, 2, 20), (0, 2, 30), (1, 2, 20)], []]
        self.assertEqual(plans.restore_plan(offers, 2), (20, [0, 0]))

    def test_nothing_whole(self):
        self.assertIsNone(plans.restore_plan([[(0, 2, 20)], []], 2))
        self.assertIsNone(plans.restore_plan([[], []], 2))

    def test_other_world_is_not_restored(self):
        self.assertIsNone(plans.restore_plan([[(0, 3, 20)], [(1, 3, 20)]], 2))


class ReslicePlanTest(unittest.TestCase):
    def test_shrink(self):
        # world 3 -> 2: rank 2's state survives at rank 1 (its buddy)
        offers = [[(0, 3, 50), (2, 3, 40)], [(1, 3, 50), (2, 3, 50)]]
        self.assertEqual(plans.reslice_plan(offers, 2), (50, 3, [0, 1, 1]))

    def test_latest_whole_step(self):
        offers = [[(0, 3, 50), (0, 3, 40), (2, 3, 40)], [(1, 3, 40), (1, 3, 50)]]
        self.assertEqual(plans.reslice_plan(offers, 2), (40, 3, [0, 1, 0]))

    def test_grow(self):
        offers = [[(0, 2, 10)], [(1, 2, 10)], []]
        self.assertEqual(plans.reslice_plan(offers, 3), (10, 2, [0, 1]))

    def test_same_world_and_missing(self):
        self.assertIsNone(plans.reslice_plan([[(0, 2, 10)], [(1, 2, 10)]], 2))
        self.assertIsNone(plans.reslice_plan([[(0, 3, 10)], [(1, 3, 10)]], 2))


class RowsTest(unittest.TestCase):
    def test_row_range_is_torch_chunk(self):
        # torch.chunk(n rows, world): chunks of ceil(n / world), the last ones short or empty
        for n in range(0, 12):
            for world in range(1, 6):
                c = -(-n // world)
                want = [(min(r * c, n), min(r * c + c, n)) for r in range(world)]
                got = [plans.row_range(n, r, world) for r in range(world)]
                self.assertEqual(got, want, (n, world))
                self.assertEqual(sum(e - s for s, e in got), n)

    def test_row_range_cases(self):
        self.assertEqual([plans.row_range(5, r, 2) for r in range(2)], [(0, 3), (3, 5)])
        self.assertEqual([plans.row_range(2, r, 3) for r in range(3)], [(0, 1), (1, 2), (2, 2)])

    def test_rows_of(self):
        spec = ((Placement("S", 0),), (10, 4), (4, 1))
        self.assertEqual([plans.rows_of(spec, r, 3) for r in range(3)], [(4,), (4,), (2,)])

    def test_torch_agrees(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        for n, world in [(7, 3), (2, 4), (9, 2)]:
            sizes = [t.shape[0] for t in torch.arange(n).chunk(world)]
            sizes += [0] * (world - len(sizes))
            self.assertEqual([e - s for s, e in (plans.row_range(n, r, world) for r in range(world))], sizes)


class PlacementTest(unittest.TestCase):
    def test_placements(self):
        self.assertEqual(plans.placement(((Placement("S", 0),), (4,), (1,))), "shard0")
        self.assertEqual(plans.placement(((Placement("R"),), (4,), (1,))), "replicate")
        self.assertIsNone(plans.placement(((Placement("S", 1),), (4, 4), (4, 1))))
        self.assertIsNone(plans.placement(((Placement("S", 0), Placement("R")), (4,), (1,))))
        self.assertTrue(plans.reslicable(None))
        self.assertTrue(plans.reslicable(((Placement("R"),), (4,), (1,))))
        self.assertFalse(plans.reslicable(((Placement("P"),), (4,), (1,))))


class BuddyTest(unittest.TestCase):
    def choices(self, nodes):
        return [plans.buddy_choice(nodes, r) for r in range(len(nodes))]

    def test_two_nodes(self):
        self.assertEqual(self.choices(["a", "a", "b", "b"]), [(2, [2]), (3, [3]), (0, [0]), (1, [1])])

    def test_three_nodes_wrap(self):
        self.assertEqual([b for b, _ in self.choices(["a", "b", "c"])], [1, 2, 0])

    def test_uneven_nodes(self):
        got = self.choices(["a", "a", "a", "b"])
        self.assertEqual([b for b, _ in got], [3, 3, 3, 0])
        self.assertEqual(got[3][1], [0, 1, 2])
        self.assertEqual(got[0][1], [3])

    def test_one_node(self):
        self.assertEqual(self.choices(["a", "a", "a"]), [(1, [2]), (2, [0]), (0, [1])])

    def test_one_rank(self):
        self.assertEqual(plans.buddy_choice(["a"], 0), (None, []))

    def test_never_on_its_own_node(self):
        nodes = ["a", "a", "b", "b", "b", "c"]
        for r, (buddy, wards) in enumerate(self.choices(nodes)):
            self.assertNotEqual(nodes[buddy], nodes[r])
            for w in wards:
                self.assertEqual(plans.buddy_choice(nodes, w)[0], r)


class NoTorchTest(unittest.TestCase):
    def test_plans_and_the_hook_import_no_torch(self):
        code = ("import sys, muster_rank.sharded.plans, muster_rank.state, muster_rank.hook; "
                "assert 'torch' not in sys.modules; "
                "assert 'muster_rank.elastic' not in sys.modules, sorted(sys.modules)")
        import muster_rank
        client = os.path.dirname(os.path.dirname(os.path.abspath(muster_rank.__file__)))
        subprocess.run([sys.executable, "-c", code], check=True, cwd=client)


if __name__ == "__main__":
    unittest.main()
