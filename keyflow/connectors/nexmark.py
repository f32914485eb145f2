"""``nexmark``: the events of the Nexmark benchmark (persons, auctions, bids), computed by Spark.

Follows the generator of Flink's Nexmark (itself Beam's): the same event kinds in the same
proportions, the same id arithmetic (which person or auction an event creates, the hot
sellers, bidders and auctions, the auctions in flight), prices, channels, URLs, names,
cities and states, and event times spaced by the event rate from a base time. Every value
is a function of (event number, field, seed) through Spark's ``xxhash64`` rather than of a
``java.util.Random`` per event, so the same seed gives the same events at any parallelism
but not the bytes Flink's generator draws; the distributions are Nexmark's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from keyflow.connectors.datagen import uniform
from keyflow.errors import PlanError

FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID, NUM_CATEGORIES = 1000, 1000, 10, 5
HOT_SELLER_RATIO = HOT_AUCTION_RATIO = HOT_BIDDER_RATIO = 100
PERSON_ID_LEAD, AUCTION_ID_LEAD = 10, 10
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")  # fmt: skip
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS_NUMBER = 10_000

COLUMNS = ("event_type", "person", "auction", "bid")


@dataclass(frozen=True)
class NexmarkConfig:
    """Nexmark's generator settings (``NexmarkConfiguration``'s defaults)."""

    events: int | None = None  # None: unbounded
    rate_limited: bool = False  # True: a stream, released at first_event_rate per second of wall time
    first_event_rate: float = 10_000  # events per second of event time (and of wall time, when unbounded)
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    base_time: str = "2026-01-01 00:00:00"  # the first event's time (Nexmark's: the wall clock at start)
    seed: int = 0
    rows_per_batch: int | None = None  # unbounded: events per micro-batch at most

    def __post_init__(self) -> None:
        for name in ("person_proportion", "auction_proportion", "bid_proportion"):
            if getattr(self, name) < 1:
                raise PlanError(f"nexmark {name.replace('_', '.')}={getattr(self, name)} must be at least 1")
        if self.events is not None and self.events < 0:
            raise PlanError(f"nexmark events.num={self.events} must be zero or positive (or unset: unbounded)")
        if not self.first_event_rate > 0:
            raise PlanError(f"nexmark first-event.rate={self.first_event_rate} must be positive")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1_000_000 / self.first_event_rate

    @property
    def base_millis(self) -> int:
        moment = datetime.fromisoformat(self.base_time)
        return round((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


class NexmarkSource:
    """One row per event: ``event_type`` (0 person, 1 auction, 2 bid) and a ``person``,
    ``auction`` or ``bid`` ROW, the other two NULL, as Flink Nexmark's table."""

    def __init__(self, config: NexmarkConfig) -> None:
        self.config = config

    @property
    def unbounded(self) -> bool:
        """A stream: no ``events.num``, or ``rate.limited`` (its events then released at the
        event rate, up to ``events.num``); otherwise one batch of ``events.num`` events."""
        return self.config.events is None or self.config.rate_limited

    def describe(self) -> dict[str, Any]:
        return {"connector": "nexmark", **{k: v for k, v in vars(self.config).items() if v is not None}}

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        return self._events(spark.range(0, self.config.events or 0, 1, numPartitions=parallelism))

    def read_stream(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """Event numbers at ``first-event.rate`` per second of wall time."""
        from keyflow.connectors.streams import row_numbers

        c = self.config
        return self._events(row_numbers(spark, parallelism, c.first_event_rate, c.events, c.rows_per_batch))

    def _events(self, ids: DataFrame) -> DataFrame:
        c, n = self.config, F.col("id")
        epoch, offset = F.floor(n / c.total_proportion), n % c.total_proportion
        kind = (
            F.when(offset < c.person_proportion, 0)
            .when(offset < c.person_proportion + c.auction_proportion, 1)
            .otherwise(2)
        )
        micros = F.lit(c.base_millis * 1000) + F.floor(n * F.lit(c.inter_event_delay_us)).cast("long")
        time = F.timestamp_micros(F.floor(micros / 1000) * 1000)
        events = ids.select(
            n.alias("n"), kind.alias("event_type"), time.alias("time"),
            (epoch * c.person_proportion + F.least(offset, F.lit(c.person_proportion - 1))).alias("last_person"),
            _last_auction(c, epoch, offset).alias("last_auction"),
        )  # fmt: skip
        random = _Random(F.col("n"), c.seed)
        return events.select(
            F.col("event_type").cast("int").alias("event_type"),
            F.when(F.col("event_type") == 0, self._person(random)).alias("person"),
            F.when(F.col("event_type") == 1, self._auction(random)).alias("auction"),
            F.when(F.col("event_type") == 2, self._bid(random)).alias("bid"),
        )

    def _person(self, r: _Random) -> Column:
        c = self.config
        name = F.concat(r.choice(1, FIRST_NAMES), F.lit(" "), r.choice(2, LAST_NAMES))
        email = F.concat(r.string(3, 7), F.lit("@"), r.string(4, 5), F.lit(".com"))
        card = F.concat_ws(" ", *(F.lpad(r.below(10 + i, 10_000).cast("string"), 4, "0") for i in range(4)))
        city, state = r.choice(5, US_CITIES), r.choice(6, US_STATES)
        return F.struct(
            (F.col("last_person") + FIRST_PERSON_ID).alias("id"), name.alias("name"), email.alias("emailAddress"),
            card.alias("creditCard"), city.alias("city"), state.alias("state"), F.col("time").alias("dateTime"),
            r.extra(7, c.avg_person_byte_size, 9 + 6 + 16 + 19 + 10 + 2 + 8).alias("extra"),
        )  # fmt: skip

    def _auction(self, r: _Random) -> Column:
        c = self.config
        seller = F.when(
            r.below(1, c.hot_sellers_ratio) > 0, F.floor(F.col("last_person") / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        ).otherwise(self._next_person(r, 2))
        initial = r.price(3)
        expires = F.timestamp_micros(F.unix_micros(F.col("time")) + self._auction_length(r, 4) * 1000)
        return F.struct(
            (F.col("last_auction") + FIRST_AUCTION_ID).alias("id"), r.string(5, 20).alias("itemName"),
            r.string(6, 100).alias("description"), initial.alias("initialBid"), (initial + r.price(7)).alias("reserve"),
            F.col("time").alias("dateTime"), expires.alias("expires"), (seller + FIRST_PERSON_ID).alias("seller"),
            (FIRST_CATEGORY_ID + r.below(8, NUM_CATEGORIES)).alias("category"),
            r.extra(9, c.avg_auction_byte_size, 8 + 20 + 100 + 8 + 8 + 8 + 8 + 8 + 8).alias("extra"),
        )  # fmt: skip

    def _bid(self, r: _Random) -> Column:
        c = self.config
        auction = F.when(
            r.below(1, c.hot_auction_ratio) > 0, F.floor(F.col("last_auction") / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        ).otherwise(self._next_auction(r, 2))
        bidder = F.when(
            r.below(3, c.hot_bidders_ratio) > 0,
            F.floor(F.col("last_person") / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
        ).otherwise(self._next_person(r, 4))
        hot = r.below(5, 2) > 0
        channel_number = r.below(6, CHANNELS_NUMBER)
        path = F.concat_ws("/", *(r.string(7 + i, 5, "_") for i in range(3)))
        base_url = F.concat(F.lit("https://www.nexmark.com/"), path, F.lit("/item.htm?query=1"))
        hot_index = r.below(10, len(HOT_CHANNELS))
        channel = F.when(hot, F.element_at(F.array(*map(F.lit, HOT_CHANNELS)), (hot_index + 1).cast("int"))).otherwise(
            F.concat(F.lit("channel-"), channel_number.cast("string"))
        )
        reversed_bits = _reversed_bits(channel_number)
        channel_id = F.when(reversed_bits == -(1 << 31), reversed_bits).otherwise(F.abs(reversed_bits))  # Java's abs
        with_id = F.concat(base_url, F.lit("&channel_id="), channel_id.cast("string"))
        url = F.when(hot | (r.below(13, 10) == 0), base_url).otherwise(with_id)  # Nexmark: 1 in 10 has no id
        return F.struct(
            (auction + FIRST_AUCTION_ID).alias("auction"), (bidder + FIRST_PERSON_ID).alias("bidder"),
            r.price(11).alias("price"), channel.alias("channel"), url.alias("url"), F.col("time").alias("dateTime"),
            r.extra(12, c.avg_bid_byte_size, 8 + 8 + 8 + 8).alias("extra"),
        )  # fmt: skip

    def _next_person(self, r: _Random, field: int) -> Column:
        """A recent person (of the last ``num_active_people``), or one a little ahead."""
        people = F.col("last_person") + 1
        active = F.least(people, F.lit(self.config.num_active_people))
        return people - active + r.below_column(field, active + PERSON_ID_LEAD)

    def _next_auction(self, r: _Random, field: int) -> Column:
        """An auction in flight (of the last ``num_in_flight_auctions``), or one a little ahead."""
        last = F.col("last_auction")
        first = F.greatest(last - self.config.num_in_flight_auctions, F.lit(0))
        return first + r.below_column(field, last - first + 1 + AUCTION_ID_LEAD)

    def _auction_length(self, r: _Random, field: int) -> Column:
        """Milliseconds until the auction expires: up to twice the time until
        ``num_in_flight_auctions`` more auctions have started."""
        c = self.config
        events_ahead = c.num_in_flight_auctions * c.total_proportion / c.auction_proportion
        horizon_ms = max(int(events_ahead * c.inter_event_delay_us / 1000), 1)
        return 1 + r.below(field, 2 * horizon_ms)


class _Random:
    """Uniform draws per event: field ``i`` of event ``n`` hashes (n, seed, i)."""

    def __init__(self, n: Column, seed: int) -> None:
        self.n, self.seed = n, seed

    def uniform(self, field: int) -> Column:
        return uniform(self.n, self.seed, field)

    def below(self, field: int, bound: int) -> Column:
        return F.floor(self.uniform(field) * F.lit(bound)).cast("long")

    def below_column(self, field: int, bound: Column) -> Column:
        return F.floor(self.uniform(field) * bound).cast("long")

    def choice(self, field: int, values: tuple[str, ...]) -> Column:
        return F.element_at(F.array(*map(F.lit, values)), (self.below(field, len(values)) + 1).cast("int"))

    def price(self, field: int) -> Column:
        """Nexmark's ``nextPrice``: 10^(6u) * 100 cents, rounded."""
        return F.round(F.pow(F.lit(10.0), self.uniform(field) * 6.0) * 100.0).cast("long")

    def string(self, field: int, max_length: int, special: str = " ") -> Column:
        """Nexmark's ``nextString``: 3 to ``max_length`` - 1 letters, about one in 13 ``special``."""
        length = 3 + self.below(field, max_length - 3)
        letters = F.translate(F.sha2(F.concat_ws(":", self.n.cast("string"), F.lit(field), F.lit(self.seed)), 512),
                              "0123456789", f"{special}bcdefghij")  # fmt: skip
        return F.substring(letters, F.lit(1), length.cast("int"))

    def extra(self, field: int, average: int, fixed: int) -> Column:
        """Nexmark's ``nextExtra``: padding that brings the event to ``average`` bytes (± 20 %)."""
        wanted = max(average - fixed, 0)
        delta = round(wanted * 0.2)
        length = wanted - delta + (self.below(field, 2 * delta) if delta else F.lit(0))
        text = F.sha2(F.concat_ws(":", self.n.cast("string"), F.lit(field)), 256)
        return F.substring(F.repeat(text, wanted // 64 + 2), F.lit(1), length.cast("int"))


def _last_auction(c: NexmarkConfig, epoch: Column, offset: Column) -> Column:
    """Nexmark's ``lastBase0AuctionId``: the newest auction created at or before this event."""
    person, auction = c.person_proportion, c.auction_proportion
    return (
        F.when(offset < person, (epoch - 1) * auction + (auction - 1))
        .when(offset >= person + auction, epoch * auction + (auction - 1))
        .otherwise(epoch * auction + offset - person)
    )


def _reversed_bits(value: Column) -> Column:
    """Java's ``Integer.reverse`` of a non-negative int below 2^31, as Nexmark's channel ids."""
    unsigned = F.conv(F.reverse(F.lpad(F.bin(value), 32, "0")), 2, 10).cast("long")
    return F.when(unsigned >= 1 << 31, unsigned - (1 << 32)).otherwise(unsigned)


def nexmark(**options: Any) -> NexmarkSource:
    """The Nexmark events: ``nexmark(events=1_000_000)`` (bounded) or ``nexmark()`` (unbounded)."""
    return NexmarkSource(NexmarkConfig(**options))
